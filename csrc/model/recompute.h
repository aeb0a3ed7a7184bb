// Full activation recomputation (activations_checkpoint_granularity: full): a chunk of layers
// runs forward without keeping anything for backward except its input; backward re-runs the
// chunk forward with autograd on and backpropagates through it (Chen et al. 2016; Megatron's
// CheckpointFunction). Dropout masks are keyed by global position (dropout_context.h), so the
// re-run draws the same masks without any saved RNG state.
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>

namespace loom::model {

using ChunkForward = std::function<at::Tensor(const at::Tensor&)>;

/// Runs `chunk(input)` under no-grad, saving only `input`; differentiable in `input` and in
/// every parameter `chunk` uses (their .grad is accumulated during the recomputing backward).
/// `chunk` must be deterministic and stay valid until backward has run.
at::Tensor checkpoint(const ChunkForward& chunk, const at::Tensor& input);

}  // namespace loom::model
