// Is a token the argmax of vocab-parallel logits? The greedy rule (the lowest id among equal
// maxima, as torch.argmax and Loom's greedy sampler pick) decided on logit shards with three
// reductions over the tensor-parallel group (global max, the token's logit, a lower id tying
// the max); the full logits are never gathered. Used by prompt-learning validation (exact
// match) and by `loom eval` (lm-evaluation-harness's is_greedy).
#pragma once
#include <ATen/core/Tensor.h>

#include "runtime/communicator.h"

namespace loom::model {

/// logits [s, b, V_padded/t] (this rank's shard, columns >= vocab_size are padding, never the
/// argmax), tokens [b, s] int64 global ids < vocab_size. Returns bool [b, s] on the logits'
/// device: tokens[i, j] is the argmax of position j of sequence i. Identical on every rank
/// of `tp` (collective).
at::Tensor vocab_parallel_is_argmax(const at::Tensor& logits, const at::Tensor& tokens,
                                    const runtime::CommunicatorPtr& tp, int64_t vocab_size);

}  // namespace loom::model
