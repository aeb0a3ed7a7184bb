// Virtual tokens written into a stage's input embeddings (prompt learning,
// docs/design/ptuning.md, "The model"): after the word embeddings have been reduced over the
// tensor-parallel group, the rows at the virtual positions are replaced by prompt vectors, then
// position embeddings are added as usual. Under sequence parallelism the spliced activation is
// then split to this rank's sequence shard.
#pragma once
#include <ATen/core/Tensor.h>

namespace loom::model {

struct PromptSplice {
  /// The n virtual positions of the micro-batch: sequence index and batch row of each, int64
  /// [n] on the stage's device (made on the host from the batch, so no device sync is needed).
  at::Tensor seq_index, batch_index;
  /// [n, h] the vector of each position, in the same order; any float dtype (converted to the
  /// model's), differentiable: the gradient of the spliced rows flows into it.
  at::Tensor vectors;

  bool active() const { return vectors.defined(); }
};

}  // namespace loom::model
