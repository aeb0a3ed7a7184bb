#include "ptune/answer_metrics.h"

#include <ATen/ATen.h>

#include "model/cross_entropy.h"
#include "model/vocab_parallel_argmax.h"

namespace loom::ptune {

at::Tensor answer_totals(const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& loss_mask,
                         const at::Tensor& answer_mask, const runtime::CommunicatorPtr& tp, int64_t vocab_size) {
  at::NoGradGuard no_grad;
  const at::Tensor ce = model::vocab_parallel_cross_entropy(logits, labels.t(), tp, vocab_size).t();  // [b, s]
  const at::Tensor loss_sum = (ce * loss_mask).sum().to(at::kDouble);
  const at::Tensor tokens = loss_mask.sum().to(at::kDouble);

  const at::Tensor right = model::vocab_parallel_is_argmax(logits, labels, tp, vocab_size);

  const at::Tensor answer = answer_mask.to(at::kBool);
  const at::Tensor has_answer = answer.any(1);
  const at::Tensor exact = (right | ~answer).all(1) & has_answer;
  return at::stack({loss_sum, tokens, exact.sum().to(at::kDouble), has_answer.sum().to(at::kDouble)});
}

}  // namespace loom::ptune
