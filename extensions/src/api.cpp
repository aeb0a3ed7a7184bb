// loom_ops/ops.h: the C++ functions, each a call of the registered op through the
// dispatcher (so autograd and the device kernel apply exactly as from Python).
#include "loom_ops/ops.h"
#include "loom_ops/paged_attention.h"

#include <stdexcept>
#include <string>

#include "op_handles.h"

namespace loom::ops {
namespace {
int64_t as_int(uint64_t v) { return static_cast<int64_t>(v); }
}  // namespace

uint64_t make_dropout_stream(uint64_t step, int64_t layer, int64_t site) {
  if (step >= (uint64_t{1} << 40))
    throw std::invalid_argument("loom::ops::make_dropout_stream: step must be < 2^40, got " +
                                std::to_string(step));
  if (layer < 0 || layer >= (int64_t{1} << 16))
    throw std::invalid_argument("loom::ops::make_dropout_stream: layer must be in [0, 65536), got " +
                                std::to_string(layer));
  if (site < 0 || site >= 256)
    throw std::invalid_argument("loom::ops::make_dropout_stream: site must be in [0, 256), got " +
                                std::to_string(site));
  return dropout_stream(step, static_cast<uint32_t>(layer), static_cast<uint32_t>(site));
}

at::Tensor dropout_keep_mask(const at::Tensor& like, const DropoutSpec& s) {
  return handles::dropout_mask().call(like, s.p, as_int(s.key.seed), as_int(s.key.stream),
                                      s.block.global_shape, s.block.offset);
}

at::Tensor dropout(const at::Tensor& x, const DropoutSpec& s) {
  return handles::dropout().call(x, s.p, as_int(s.key.seed), as_int(s.key.stream),
                                 s.block.global_shape, s.block.offset);
}

at::Tensor bias_dropout_add(const at::Tensor& x, const std::optional<at::Tensor>& bias,
                            const at::Tensor& residual, const DropoutSpec& s) {
  return handles::bias_dropout_add().call(x, bias, residual, s.p, as_int(s.key.seed),
                                          as_int(s.key.stream), s.block.global_shape,
                                          s.block.offset);
}

at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                      double eps) {
  return std::get<0>(handles::layer_norm().call(x, weight, bias, eps));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_with_stats(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps) {
  return handles::layer_norm().call(x, weight, bias, eps);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& weight,
    const at::Tensor& mean, const at::Tensor& rstd) {
  return handles::layer_norm_backward().call(grad_out, x, weight, mean, rstd);
}

at::Tensor scaled_masked_softmax(const at::Tensor& x, const std::optional<at::Tensor>& mask,
                                 double scale, bool causal) {
  return handles::scaled_masked_softmax().call(x, mask, scale, causal);
}

at::Tensor scaled_masked_softmax_backward(const at::Tensor& grad_out, const at::Tensor& y,
                                          double scale) {
  return handles::scaled_masked_softmax_backward().call(grad_out, y, scale);
}

at::Tensor core_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const std::optional<at::Tensor>& mask, double scale, bool causal,
                          const DropoutSpec& s) {
  return handles::core_attention().call(q, k, v, mask, scale, causal, s.p, as_int(s.key.seed),
                                        as_int(s.key.stream), s.block.global_shape,
                                        s.block.offset);
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& key_cache,
                           const at::Tensor& value_cache, const at::Tensor& block_tables,
                           const at::Tensor& context_lens, double scale,
                           const std::optional<at::Tensor>& query_starts) {
  return handles::paged_attention().call(q, key_cache, value_cache, block_tables, context_lens,
                                         scale, query_starts);
}

at::Tensor bias_gelu(const at::Tensor& x, const at::Tensor& bias) {
  return handles::bias_gelu().call(x, bias);
}

at::Tensor bias_gelu_backward(const at::Tensor& grad_out, const at::Tensor& x,
                              const at::Tensor& bias) {
  return handles::bias_gelu_backward().call(grad_out, x, bias);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return std::get<0>(handles::rms_norm().call(x, weight, eps));
}

std::tuple<at::Tensor, at::Tensor> rms_norm_with_rstd(const at::Tensor& x, const at::Tensor& weight,
                                                      double eps) {
  return handles::rms_norm().call(x, weight, eps);
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& grad_out, const at::Tensor& x,
                                                     const at::Tensor& weight, const at::Tensor& rstd) {
  return handles::rms_norm_backward().call(grad_out, x, weight, rstd);
}

at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return handles::rotary().call(x, cos, sin);
}

at::Tensor rotary_backward(const at::Tensor& grad_out, const at::Tensor& cos, const at::Tensor& sin) {
  return handles::rotary_backward().call(grad_out, cos, sin);
}

at::Tensor swiglu(const at::Tensor& x) { return handles::swiglu().call(x); }

at::Tensor swiglu_backward(const at::Tensor& grad_out, const at::Tensor& x) {
  return handles::swiglu_backward().call(grad_out, x);
}

}  // namespace loom::ops
