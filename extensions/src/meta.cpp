// Meta kernels (shapes and dtypes only) of the `loom` ops, for fake tensors, torch.compile
// and torch.library.opcheck. They run the same argument checks as the real kernels.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "internal.h"
#include "kernels.h"
#include "paged_attention.h"

namespace loom::ops {

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_meta(const at::Tensor& x,
                                                               const at::Tensor& weight,
                                                               const at::Tensor& bias, double) {
  internal::check_layer_norm(x, weight, bias);
  auto stat_shape = x.sizes().vec();
  stat_shape.pop_back();
  const auto sd = internal::acc_dtype(x.scalar_type());
  return {at::empty_like(x, at::MemoryFormat::Contiguous), at::empty(stat_shape, x.options().dtype(sd)),
          at::empty(stat_shape, x.options().dtype(sd))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_meta(
    const at::Tensor& dy, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& mean,
    const at::Tensor& rstd) {
  internal::check_layer_norm_backward(dy, x, weight, mean, rstd);
  return {at::empty_like(x, at::MemoryFormat::Contiguous), at::empty_like(weight),
          at::empty_like(weight)};
}

at::Tensor dropout_meta(const at::Tensor& x, double p, int64_t, int64_t,
                        at::IntArrayRef global_shape, at::IntArrayRef offset) {
  internal::check_floating("dropout", "input", x);
  internal::check_probability("dropout", p);
  internal::dropout_layout("dropout", x, global_shape, offset);
  return at::empty_like(x, at::MemoryFormat::Contiguous);
}

at::Tensor dropout_mask_meta(const at::Tensor& like, double p, int64_t, int64_t,
                             at::IntArrayRef global_shape, at::IntArrayRef offset) {
  internal::check_probability("dropout_mask", p);
  internal::dropout_layout("dropout_mask", like, global_shape, offset);
  return at::empty(like.sizes(), like.options().dtype(at::kBool));
}

at::Tensor bias_dropout_add_meta(const at::Tensor& x, const std::optional<at::Tensor>& bias,
                                 const at::Tensor& residual, double p, int64_t, int64_t,
                                 at::IntArrayRef global_shape, at::IntArrayRef offset) {
  internal::check_bias_dropout_add(x, bias, residual, p);
  internal::dropout_layout("bias_dropout_add", x, global_shape, offset);
  return at::empty_like(x, at::MemoryFormat::Contiguous);
}

at::Tensor scaled_masked_softmax_meta(const at::Tensor& x, const std::optional<at::Tensor>& mask,
                                      double, bool) {
  internal::check_softmax(x, mask);
  return at::empty_like(x, at::MemoryFormat::Contiguous);
}

at::Tensor scaled_masked_softmax_backward_meta(const at::Tensor& dy, const at::Tensor& y,
                                               double) {
  internal::check_softmax_backward(dy, y);
  return at::empty_like(y, at::MemoryFormat::Contiguous);
}

at::Tensor paged_attention_meta(const at::Tensor& q, const at::Tensor& key_cache,
                                const at::Tensor& value_cache, const at::Tensor& block_tables,
                                const at::Tensor& context_lens, double,
                                const std::optional<at::Tensor>& query_starts) {
  internal::check_paged_attention(q, key_cache, value_cache, block_tables, context_lens, query_starts);
  return at::empty_like(q, at::MemoryFormat::Contiguous);
}

at::Tensor bias_gelu_meta(const at::Tensor& x, const at::Tensor& bias) {
  internal::check_bias_gelu(x, bias);
  return at::empty_like(x, at::MemoryFormat::Contiguous);
}

at::Tensor bias_gelu_backward_meta(const at::Tensor& dy, const at::Tensor& x,
                                   const at::Tensor& bias) {
  internal::check_bias_gelu(x, bias);
  return at::empty_like(x, at::MemoryFormat::Contiguous);
}

std::tuple<at::Tensor, at::Tensor> rms_norm_meta(const at::Tensor& x, const at::Tensor& weight,
                                                 double) {
  internal::check_rms_norm(x, weight);
  auto stat_shape = x.sizes().vec();
  stat_shape.pop_back();
  return {at::empty_like(x, at::MemoryFormat::Contiguous),
          at::empty(stat_shape, x.options().dtype(internal::acc_dtype(x.scalar_type())))};
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_meta(const at::Tensor& dy, const at::Tensor& x,
                                                          const at::Tensor& weight,
                                                          const at::Tensor& rstd) {
  internal::check_rms_norm_backward(dy, x, weight, rstd);
  return {at::empty_like(x, at::MemoryFormat::Contiguous), at::empty_like(weight)};
}

at::Tensor rotary_meta(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  internal::check_rotary("rotary", "input", x, cos, sin);
  return at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
}

at::Tensor rotary_backward_meta(const at::Tensor& dy, const at::Tensor& cos, const at::Tensor& sin) {
  internal::check_rotary("rotary_backward", "grad_out", dy, cos, sin);
  return at::empty(dy.sizes(), dy.options().memory_format(at::MemoryFormat::Contiguous));
}

at::Tensor swiglu_meta(const at::Tensor& x) {
  internal::check_swiglu(x);
  return at::empty(internal::with_last_dim(x, x.size(-1) / 2), x.options());
}

at::Tensor swiglu_backward_meta(const at::Tensor& dy, const at::Tensor& x) {
  internal::check_swiglu_backward(dy, x);
  return at::empty_like(x, at::MemoryFormat::Contiguous);
}

}  // namespace loom::ops

TORCH_LIBRARY_IMPL(loom, Meta, m) {
  m.impl("layer_norm", &loom::ops::layer_norm_meta);
  m.impl("layer_norm_backward", &loom::ops::layer_norm_backward_meta);
  m.impl("dropout", &loom::ops::dropout_meta);
  m.impl("dropout_mask", &loom::ops::dropout_mask_meta);
  m.impl("bias_dropout_add", &loom::ops::bias_dropout_add_meta);
  m.impl("scaled_masked_softmax", &loom::ops::scaled_masked_softmax_meta);
  m.impl("scaled_masked_softmax_backward", &loom::ops::scaled_masked_softmax_backward_meta);
  m.impl("paged_attention", &loom::ops::paged_attention_meta);
  m.impl("bias_gelu", &loom::ops::bias_gelu_meta);
  m.impl("bias_gelu_backward", &loom::ops::bias_gelu_backward_meta);
  m.impl("rms_norm", &loom::ops::rms_norm_meta);
  m.impl("rms_norm_backward", &loom::ops::rms_norm_backward_meta);
  m.impl("rotary", &loom::ops::rotary_meta);
  m.impl("rotary_backward", &loom::ops::rotary_backward_meta);
  m.impl("swiglu", &loom::ops::swiglu_meta);
  m.impl("swiglu_backward", &loom::ops::swiglu_backward_meta);
}
