#include "ptune/answer_metrics.h"

#include <ATen/ATen.h>

#include <limits>

#include "model/cross_entropy.h"

namespace loom::ptune {

at::Tensor answer_totals(const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& loss_mask,
                         const at::Tensor& answer_mask, const runtime::CommunicatorPtr& tp, int64_t vocab_size) {
  at::NoGradGuard no_grad;
  const at::Tensor ce = model::vocab_parallel_cross_entropy(logits, labels.t(), tp, vocab_size).t();  // [b, s]
  const at::Tensor loss_sum = (ce * loss_mask).sum().to(at::kDouble);
  const at::Tensor tokens = loss_mask.sum().to(at::kDouble);

  const int64_t shard = logits.size(-1);
  const int64_t first = static_cast<int64_t>(tp->rank()) * shard;
  const float lowest = -std::numeric_limits<float>::infinity();
  at::Tensor x = logits.to(at::kFloat).transpose(0, 1);  // [b, s, V/t]
  const at::Tensor ids = at::arange(first, first + shard, labels.options());  // global ids of the columns
  x = x.masked_fill(ids >= vocab_size, lowest);  // padding is never predicted

  at::Tensor top = std::get<0>(x.max(-1)).contiguous();  // [b, s]
  tp->all_reduce(top, runtime::ReduceOp::kMax);
  const at::Tensor local_label = labels - first;
  const at::Tensor owned = (local_label >= 0) & (local_label < shard);
  at::Tensor gold = x.gather(-1, local_label.clamp(0, shard - 1).unsqueeze(-1)).squeeze(-1);
  gold = gold.masked_fill(~owned, lowest).contiguous();
  tp->all_reduce(gold, runtime::ReduceOp::kMax);
  // Does a lower id than the gold one reach the maximum (the greedy choice would be it)?
  const at::Tensor at_top = x == top.unsqueeze(-1);
  at::Tensor lower_tie = (at_top & (ids.view({1, 1, -1}) < labels.unsqueeze(-1))).any(-1).to(at::kFloat).contiguous();
  tp->all_reduce(lower_tie, runtime::ReduceOp::kMax);
  const at::Tensor right = (gold == top) & (lower_tie == 0);

  const at::Tensor answer = answer_mask.to(at::kBool);
  const at::Tensor has_answer = answer.any(1);
  const at::Tensor exact = (right | ~answer).all(1) & has_answer;
  return at::stack({loss_sum, tokens, exact.sum().to(at::kDouble), has_answer.sum().to(at::kDouble)});
}

}  // namespace loom::ptune
