// core_attention and its backward as compositions of GEMMs (at::matmul) and the loom
// softmax / dropout ops, registered as CompositeExplicitAutograd so they run on every
// device (and on Meta for shapes). Backward recomputes scores, probabilities and the
// dropout mask from q, k, v: the "selective activation recomputation" of Korthikanti et
// al. 2022 (design note docs/design/sp_sar.md) as one op.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "internal.h"
#include "op_handles.h"

namespace loom::ops {
namespace {

using OptTensor = std::optional<at::Tensor>;

void check_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  internal::check_floating("core_attention", "q", q);
  TORCH_CHECK(q.dim() >= 3 && k.dim() == q.dim() && v.dim() == q.dim(),
              "loom::core_attention: q, k, v must be [..., s, d] with the same number (>= 3) "
              "of dimensions, got q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "loom::core_attention: q, k, v must share a dtype, got ", q.scalar_type(), ", ",
              k.scalar_type(), ", ", v.scalar_type());
  for (int64_t d = 0; d + 2 < q.dim(); ++d)
    TORCH_CHECK(k.size(d) == q.size(d) && v.size(d) == q.size(d),
                "loom::core_attention: batch/head dimension ", d, " differs: q ", q.sizes(),
                ", k ", k.sizes(), ", v ", v.sizes());
  TORCH_CHECK(k.size(-1) == q.size(-1), "loom::core_attention: q and k head sizes differ: q ",
              q.sizes(), ", k ", k.sizes());
  TORCH_CHECK(v.size(-2) == k.size(-2), "loom::core_attention: k and v key lengths differ: k ",
              k.sizes(), ", v ", v.sizes());
  internal::check_same_device("core_attention", q, "k", k);
  internal::check_same_device("core_attention", q, "v", v);
}

/// Probabilities before and after dropout, recomputed identically in forward and backward.
std::pair<at::Tensor, at::Tensor> attention_probs(const at::Tensor& q, const at::Tensor& k,
                                                  const OptTensor& mask, double scale,
                                                  bool causal, double p, int64_t seed,
                                                  int64_t stream, at::IntArrayRef global_shape,
                                                  at::IntArrayRef offset) {
  internal::check_probability("core_attention", p);
  const at::Tensor scores = at::matmul(q, k.transpose(-2, -1));
  internal::dropout_layout("core_attention", scores, global_shape, offset);
  const at::Tensor probs = handles::scaled_masked_softmax().call(scores, mask, scale, causal);
  const at::Tensor dropped =
      p > 0.0 ? handles::dropout().call(probs, p, seed, stream, global_shape, offset) : probs;
  return {probs, dropped};
}

at::Tensor core_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const OptTensor& mask, double scale, bool causal, double p,
                          int64_t seed, int64_t stream, at::IntArrayRef global_shape,
                          at::IntArrayRef offset) {
  check_attention(q, k, v);
  const auto probs =
      attention_probs(q, k, mask, scale, causal, p, seed, stream, global_shape, offset);
  return at::matmul(probs.second, v);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> core_attention_backward(
    const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const OptTensor& mask, double scale, bool causal, double p, int64_t seed, int64_t stream,
    at::IntArrayRef global_shape, at::IntArrayRef offset) {
  check_attention(q, k, v);
  const auto [probs, dropped] =
      attention_probs(q, k, mask, scale, causal, p, seed, stream, global_shape, offset);
  at::Tensor dv = at::matmul(dropped.transpose(-2, -1), grad);
  at::Tensor d_dropped = at::matmul(grad, v.transpose(-2, -1));
  at::Tensor d_probs =
      p > 0.0 ? handles::dropout().call(d_dropped, p, seed, stream, global_shape, offset)
              : d_dropped;
  at::Tensor d_scores = handles::scaled_masked_softmax_backward().call(d_probs, probs, scale);
  at::Tensor dq = at::matmul(d_scores, k);
  at::Tensor dk = at::matmul(d_scores.transpose(-2, -1), q);
  return {dq, dk, dv};
}

}  // namespace
}  // namespace loom::ops

TORCH_LIBRARY_IMPL(loom, CompositeExplicitAutograd, m) {
  m.impl("core_attention", &loom::ops::core_attention);
  m.impl("core_attention_backward", &loom::ops::core_attention_backward);
}
