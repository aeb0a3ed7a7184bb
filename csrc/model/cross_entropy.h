// Vocab-parallel cross entropy on logit shards (docs/design/parallel_layout.md, "Vocab-parallel cross
// entropy"; Megatron-LM's _VocabParallelCrossEntropy): the full logits are never gathered.
// Forward: local max -> all-reduce MAX; target logit (owning rank) -> all-reduce SUM; sum of
// exp -> all-reduce SUM; loss = log(sum) - target. Backward needs no communication.
#pragma once
#include <ATen/core/Tensor.h>

#include "runtime/communicator.h"

namespace loom::model {

/// logits [..., V/t]: rank r's columns [r·V/t, (r+1)·V/t) of the (padded) vocabulary, any
/// float dtype (computed in float32). target [...] int64 global token ids < vocab_size.
/// Columns >= vocab_size (vocabulary padding) are excluded from the softmax, so the loss does
/// not depend on the padding. label_smoothing ε spreads ε over the other vocab_size − 1
/// classes (target probability 1 − ε), using the *global* real vocabulary size on every rank,
/// so every t gives the same loss and gradients.
/// Returns the per-token loss [...] (float32), identical on every rank of the group.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& target,
                                        const runtime::CommunicatorPtr& tp, int64_t vocab_size,
                                        double label_smoothing = 0.0);

}  // namespace loom::model
