// Validation of a prompt-learning run (docs/design/ptuning.md, "Evaluation"): the loss and the
// exact-match accuracy of greedy answers, from one teacher-forced forward pass. Greedy
// decoding yields exactly the gold answer and then stops iff every answer position's argmax
// (the lowest id among equal maxima, the greedy sampler's rule) is the gold next token, the
// <|endoftext|> after the answer included. The check runs on vocab-parallel logit shards
// (model/vocab_parallel_argmax.h); the full logits are never gathered.
#pragma once
#include <ATen/core/Tensor.h>

#include "runtime/communicator.h"

namespace loom::ptune {

/// logits [s, b, V_padded/t] (this rank's vocabulary shard, columns >= vocab_size are padding),
/// labels [b, s] int64, loss_mask [b, s] float32, answer_mask [b, s] (nonzero at the positions
/// whose label is an answer token or the EOS after it). Returns float64 [4] on the logits'
/// device: Σ loss_mask·cross-entropy, Σ loss_mask, examples answered exactly, examples with an
/// answer. Identical on every rank of `tp` (collective).
at::Tensor answer_totals(const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& loss_mask,
                         const at::Tensor& answer_mask, const runtime::CommunicatorPtr& tp, int64_t vocab_size);

}  // namespace loom::ptune
