#include "model/vocab_parallel_argmax.h"

#include <ATen/ATen.h>

#include <limits>

namespace loom::model {

at::Tensor vocab_parallel_is_argmax(const at::Tensor& logits, const at::Tensor& tokens,
                                    const runtime::CommunicatorPtr& tp, int64_t vocab_size) {
  at::NoGradGuard no_grad;
  const int64_t shard = logits.size(-1);
  const int64_t first = static_cast<int64_t>(tp->rank()) * shard;
  const float lowest = -std::numeric_limits<float>::infinity();
  at::Tensor x = logits.to(at::kFloat).transpose(0, 1);  // [b, s, V/t]
  const at::Tensor ids = at::arange(first, first + shard, tokens.options());  // global ids of the columns
  x = x.masked_fill(ids >= vocab_size, lowest);  // padding is never predicted

  at::Tensor top = std::get<0>(x.max(-1)).contiguous();  // [b, s]
  tp->all_reduce(top, runtime::ReduceOp::kMax);
  const at::Tensor local = tokens - first;
  const at::Tensor owned = (local >= 0) & (local < shard);
  at::Tensor mine = x.gather(-1, local.clamp(0, shard - 1).unsqueeze(-1)).squeeze(-1);
  mine = mine.masked_fill(~owned, lowest).contiguous();
  tp->all_reduce(mine, runtime::ReduceOp::kMax);
  // Does a lower id than the token reach the maximum (the greedy choice would be it)?
  const at::Tensor at_top = x == top.unsqueeze(-1);
  at::Tensor lower_tie =
      (at_top & (ids.view({1, 1, -1}) < tokens.unsqueeze(-1))).any(-1).to(at::kFloat).contiguous();
  tp->all_reduce(lower_tie, runtime::ReduceOp::kMax);
  return (mine == top) & (lower_tie == 0);
}

}  // namespace loom::model
