// The next forward waits per bucket for the distributed optimizer's overlapped parameter
// all-gather (model.optim.overlap_param_sync; Megatron-Core's overlap_param_gather with its
// forward pre-hooks; docs/design/parallel_layout.md, "Overlapped parameter all-gather").
// step() issues one all-gather per gradient bucket in the forward's order (distributed_optimizer.h);
// every chunk's read hook (GptStage::set_param_read_hook) then completes, before the embedding,
// each transformer layer and the head read their parameters, only the gathers those parameters
// need and not yet done, so the first layers compute while the later layers' gathers run.
//
// Why nothing reads a stale parameter: every parameter a chunk reads is behind its part's hook,
// a backward (and full recomputation) only follows its own forward, zeroing the gradient buffer
// and the overlapped gradient reduction touch no parameter, and whatever the forward did not
// read is completed by the optimizer before its update (step()), evaluation and checkpoints
// (wait_for_params), state_dict() and load_state_dict().
#pragma once
#include <vector>

#include "model/gpt_stage.h"
#include "train/optim/optimizer.h"

namespace loom::train {

/// Sets every chunk's read hook to optimizer.wait_for_params_of(its parts, as indices of
/// optimizer.params()) and tells the optimizer that start_iteration() need not wait for all
/// parameters. optimizer.params() must be chunk_parameters(chunks) (model_setup.h): the same
/// tensors in the same order; throws std::invalid_argument naming the first mismatch. Both must
/// outlive every forward of the chunks (the hooks refer to the optimizer). Harmless without
/// overlap_param_gather (nothing is ever pending).
void wait_for_params_in_forward(std::vector<model::GptStage>& chunks, optim::Optimizer& optimizer);

}  // namespace loom::train
