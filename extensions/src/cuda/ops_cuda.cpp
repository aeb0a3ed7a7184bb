// CUDA implementations of the `loom` ops: argument checks (shared with CPU, ../common.cpp),
// contiguity, output allocation and the current stream; the kernels are the raw-pointer
// launchers of launchers.h. Supported dtypes: float32, bfloat16, float16.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "cuda/launchers.h"
#include "cuda/paged_attention_launcher.h"
#include "internal.h"
#include "kernels.h"
#include "paged_attention.h"
#include "loom_ops/philox.h"

namespace loom::ops {
namespace {

cuda::DType kernel_dtype(const char* op, const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return cuda::DType::kFloat;
    case at::kBFloat16: return cuda::DType::kBFloat16;
    case at::kHalf: return cuda::DType::kHalf;
    default:
      TORCH_CHECK(false, "loom::", op, ": CUDA kernels take float32, bfloat16 or float16, got ",
                  t.scalar_type());
  }
}

cudaStream_t current_stream() { return at::cuda::getCurrentCUDAStream().stream(); }

at::Tensor float_param(const at::Tensor& p) { return p.to(at::kFloat).contiguous(); }

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_cuda(const at::Tensor& x_in,
                                                               const at::Tensor& weight,
                                                               const at::Tensor& bias,
                                                               double eps) {
  internal::check_layer_norm(x_in, weight, bias);
  const auto dt = kernel_dtype("layer_norm", x_in);
  c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  const at::Tensor gamma = float_param(weight), beta = float_param(bias);
  const int64_t cols = x.size(-1);
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  auto stat_shape = x.sizes().vec();
  stat_shape.pop_back();
  at::Tensor y = at::empty_like(x);
  at::Tensor mean = at::empty(stat_shape, x.options().dtype(at::kFloat));
  at::Tensor rstd = at::empty(stat_shape, x.options().dtype(at::kFloat));
  cuda::layer_norm_forward(dt, x.const_data_ptr(), gamma.const_data_ptr<float>(),
                           beta.const_data_ptr<float>(), y.mutable_data_ptr(),
                           mean.mutable_data_ptr<float>(), rstd.mutable_data_ptr<float>(), rows,
                           cols, static_cast<float>(eps), current_stream());
  return {y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_cuda(
    const at::Tensor& dy_in, const at::Tensor& x_in, const at::Tensor& weight,
    const at::Tensor& mean_in, const at::Tensor& rstd_in) {
  internal::check_layer_norm_backward(dy_in, x_in, weight, mean_in, rstd_in);
  const auto dt = kernel_dtype("layer_norm_backward", x_in);
  c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), dy = dy_in.contiguous();
  const at::Tensor mean = mean_in.contiguous(), rstd = rstd_in.contiguous();
  const at::Tensor gamma = float_param(weight);
  const int64_t cols = x.size(-1);
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  at::Tensor dx = at::empty_like(x);
  at::Tensor dgamma = at::empty({cols}, x.options().dtype(at::kFloat));
  at::Tensor dbeta = at::empty({cols}, x.options().dtype(at::kFloat));
  at::Tensor workspace = at::empty({std::max<int64_t>(1, cuda::layer_norm_backward_workspace(rows, cols))},
                                   x.options().dtype(at::kFloat));
  cuda::layer_norm_backward(dt, dy.const_data_ptr(), x.const_data_ptr(),
                            mean.const_data_ptr<float>(), rstd.const_data_ptr<float>(),
                            gamma.const_data_ptr<float>(), dx.mutable_data_ptr(),
                            dgamma.mutable_data_ptr<float>(), dbeta.mutable_data_ptr<float>(),
                            workspace.mutable_data_ptr<float>(), rows, cols, current_stream());
  return {dx, dgamma.to(weight.scalar_type()), dbeta.to(weight.scalar_type())};
}

at::Tensor dropout_mask_cuda(const at::Tensor& like, double p, int64_t seed, int64_t stream,
                             at::IntArrayRef global_shape, at::IntArrayRef offset) {
  internal::check_probability("dropout_mask", p);
  const ElementLayout layout = internal::dropout_layout("dropout_mask", like, global_shape, offset);
  c10::cuda::CUDAGuard guard(like.device());
  at::Tensor mask = at::empty(like.sizes(), like.options().dtype(at::kBool));
  cuda::dropout_mask(mask.mutable_data_ptr<bool>(), layout, static_cast<uint64_t>(seed),
                     static_cast<uint64_t>(stream), dropout_keep_threshold(p), current_stream());
  return mask;
}

at::Tensor dropout_cuda(const at::Tensor& x_in, double p, int64_t seed, int64_t stream,
                        at::IntArrayRef global_shape, at::IntArrayRef offset) {
  internal::check_floating("dropout", "input", x_in);
  internal::check_probability("dropout", p);
  const auto dt = kernel_dtype("dropout", x_in);
  const ElementLayout layout = internal::dropout_layout("dropout", x_in, global_shape, offset);
  c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty_like(x);
  cuda::dropout_forward(dt, x.const_data_ptr(), nullptr, nullptr, out.mutable_data_ptr(), layout,
                        static_cast<uint64_t>(seed), static_cast<uint64_t>(stream),
                        dropout_keep_threshold(p), dropout_scale(p), current_stream());
  return out;
}

at::Tensor bias_dropout_add_cuda(const at::Tensor& x_in, const std::optional<at::Tensor>& bias,
                                 const at::Tensor& residual_in, double p, int64_t seed,
                                 int64_t stream, at::IntArrayRef global_shape,
                                 at::IntArrayRef offset) {
  internal::check_bias_dropout_add(x_in, bias, residual_in, p);
  const auto dt = kernel_dtype("bias_dropout_add", x_in);
  const ElementLayout layout =
      internal::dropout_layout("bias_dropout_add", x_in, global_shape, offset);
  c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), residual = residual_in.contiguous();
  at::Tensor b;
  if (bias) b = float_param(*bias);
  at::Tensor out = at::empty_like(x);
  cuda::dropout_forward(dt, x.const_data_ptr(), b.defined() ? b.const_data_ptr<float>() : nullptr,
                        residual.const_data_ptr(), out.mutable_data_ptr(), layout,
                        static_cast<uint64_t>(seed), static_cast<uint64_t>(stream),
                        dropout_keep_threshold(p), dropout_scale(p), current_stream());
  return out;
}

at::Tensor scaled_masked_softmax_cuda(const at::Tensor& x_in,
                                      const std::optional<at::Tensor>& mask, double scale,
                                      bool causal) {
  internal::check_softmax(x_in, mask);
  const auto dt = kernel_dtype("scaled_masked_softmax", x_in);
  c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  at::Tensor y = at::empty_like(x);
  if (x.numel() == 0) return y;
  const int64_t sk = x.size(-1), sq = x.size(-2), rows = x.numel() / sk;
  internal::MaskRows m;
  if (mask) m = internal::prepare_mask(*mask, x);
  cuda::softmax_forward(dt, x.const_data_ptr(), mask ? m.data.const_data_ptr<bool>() : nullptr,
                        mask ? m.row_offsets.const_data_ptr<int64_t>() : nullptr,
                        y.mutable_data_ptr(), rows, sq, sk, static_cast<float>(scale), causal,
                        current_stream());
  return y;
}

at::Tensor scaled_masked_softmax_backward_cuda(const at::Tensor& dy_in, const at::Tensor& y_in,
                                               double scale) {
  internal::check_softmax_backward(dy_in, y_in);
  const auto dt = kernel_dtype("scaled_masked_softmax_backward", y_in);
  c10::cuda::CUDAGuard guard(y_in.device());
  const at::Tensor dy = dy_in.contiguous(), y = y_in.contiguous();
  at::Tensor dx = at::empty_like(y);
  if (y.numel() == 0) return dx;
  const int64_t sk = y.size(-1), rows = y.numel() / sk;
  cuda::softmax_backward(dt, dy.const_data_ptr(), y.const_data_ptr(), dx.mutable_data_ptr(), rows,
                         sk, static_cast<float>(scale), current_stream());
  return dx;
}

at::Tensor bias_gelu_cuda(const at::Tensor& x_in, const at::Tensor& bias) {
  internal::check_bias_gelu(x_in, bias);
  const auto dt = kernel_dtype("bias_gelu", x_in);
  c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), b = float_param(bias);
  at::Tensor y = at::empty_like(x);
  const int64_t cols = x.size(-1);
  if (x.numel() == 0) return y;
  cuda::bias_gelu_forward(dt, x.const_data_ptr(), b.const_data_ptr<float>(), y.mutable_data_ptr(),
                          x.numel() / cols, cols, current_stream());
  return y;
}

at::Tensor bias_gelu_backward_cuda(const at::Tensor& dy_in, const at::Tensor& x_in,
                                   const at::Tensor& bias) {
  internal::check_bias_gelu(x_in, bias);
  TORCH_CHECK(dy_in.sizes() == x_in.sizes() && dy_in.scalar_type() == x_in.scalar_type(),
              "loom::bias_gelu_backward: grad_out must match the input (", x_in.sizes(), ", ",
              x_in.scalar_type(), "), got ", dy_in.sizes(), ", ", dy_in.scalar_type());
  const auto dt = kernel_dtype("bias_gelu_backward", x_in);
  c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), dy = dy_in.contiguous(), b = float_param(bias);
  at::Tensor dx = at::empty_like(x);
  const int64_t cols = x.size(-1);
  if (x.numel() == 0) return dx;
  cuda::bias_gelu_backward(dt, dy.const_data_ptr(), x.const_data_ptr(), b.const_data_ptr<float>(),
                           dx.mutable_data_ptr(), x.numel() / cols, cols, current_stream());
  return dx;
}

std::tuple<at::Tensor, at::Tensor> rms_norm_cuda(const at::Tensor& x_in, const at::Tensor& weight,
                                                 double eps) {
  internal::check_rms_norm(x_in, weight);
  const auto dt = kernel_dtype("rms_norm", x_in);
  c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  const at::Tensor gamma = float_param(weight);
  const int64_t cols = x.size(-1);
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  auto stat_shape = x.sizes().vec();
  stat_shape.pop_back();
  at::Tensor y = at::empty_like(x);
  at::Tensor rstd = at::empty(stat_shape, x.options().dtype(at::kFloat));
  cuda::rms_norm_forward(dt, x.const_data_ptr(), gamma.const_data_ptr<float>(), y.mutable_data_ptr(),
                         rstd.mutable_data_ptr<float>(), rows, cols, static_cast<float>(eps),
                         current_stream());
  return {y, rstd};
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cuda(const at::Tensor& dy_in,
                                                          const at::Tensor& x_in,
                                                          const at::Tensor& weight,
                                                          const at::Tensor& rstd_in) {
  internal::check_rms_norm_backward(dy_in, x_in, weight, rstd_in);
  const auto dt = kernel_dtype("rms_norm_backward", x_in);
  c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), dy = dy_in.contiguous(), rstd = rstd_in.contiguous();
  const at::Tensor gamma = float_param(weight);
  const int64_t cols = x.size(-1);
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  at::Tensor dx = at::empty_like(x);
  at::Tensor dgamma = at::empty({cols}, x.options().dtype(at::kFloat));
  at::Tensor workspace = at::empty({std::max<int64_t>(1, cuda::layer_norm_backward_workspace(rows, cols))},
                                   x.options().dtype(at::kFloat));
  cuda::rms_norm_backward(dt, dy.const_data_ptr(), x.const_data_ptr(), rstd.const_data_ptr<float>(),
                          gamma.const_data_ptr<float>(), dx.mutable_data_ptr(),
                          dgamma.mutable_data_ptr<float>(), workspace.mutable_data_ptr<float>(), rows,
                          cols, current_stream());
  return {dx, dgamma.to(weight.scalar_type())};
}

namespace {

at::Tensor rotary_apply_cuda(const char* op, const char* arg, const at::Tensor& x_in,
                             const at::Tensor& cos_in, const at::Tensor& sin_in, bool backward) {
  internal::check_rotary(op, arg, x_in, cos_in, sin_in);
  const auto dt = kernel_dtype(op, x_in);
  c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.stride(3) == 1 ? x_in : x_in.contiguous();
  const at::Tensor cos = cos_in.contiguous(), sin = sin_in.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (out.numel() == 0) return out;
  cuda::rotary(dt, x.const_data_ptr(), x.stride(0), x.stride(1), x.stride(2), cos.const_data_ptr(),
               sin.const_data_ptr(), out.mutable_data_ptr(), x.size(0), x.size(1), x.size(2),
               x.size(3), cos.size(3), cos.size(0), backward, current_stream());
  return out;
}

}  // namespace

at::Tensor rotary_cuda(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return rotary_apply_cuda("rotary", "input", x, cos, sin, /*backward=*/false);
}

at::Tensor rotary_backward_cuda(const at::Tensor& dy, const at::Tensor& cos, const at::Tensor& sin) {
  return rotary_apply_cuda("rotary_backward", "grad_out", dy, cos, sin, /*backward=*/true);
}

at::Tensor swiglu_cuda(const at::Tensor& x_in) {
  internal::check_swiglu(x_in);
  const auto dt = kernel_dtype("swiglu", x_in);
  c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  at::Tensor y = at::empty(internal::with_last_dim(x, x.size(-1) / 2), x.options());
  cuda::swiglu_forward(dt, x.const_data_ptr(), y.mutable_data_ptr(), y.numel(), current_stream());
  return y;
}

at::Tensor swiglu_backward_cuda(const at::Tensor& dy_in, const at::Tensor& x_in) {
  internal::check_swiglu_backward(dy_in, x_in);
  const auto dt = kernel_dtype("swiglu_backward", x_in);
  c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), dy = dy_in.contiguous();
  at::Tensor dx = at::empty_like(x);
  cuda::swiglu_backward(dt, dy.const_data_ptr(), x.const_data_ptr(), dx.mutable_data_ptr(), dy.numel(),
                        current_stream());
  return dx;
}

}  // namespace loom::ops

namespace loom::ops {

at::Tensor paged_attention_cuda(const at::Tensor& q_in, const at::Tensor& key_cache,
                                const at::Tensor& value_cache, const at::Tensor& block_tables,
                                const at::Tensor& context_lens, double scale,
                                const std::optional<at::Tensor>& query_starts) {
  internal::check_paged_attention(q_in, key_cache, value_cache, block_tables, context_lens, query_starts);
  const int64_t max_blocks = block_tables.size(1), block_size = key_cache.size(2), d = q_in.size(3);
  // The kernel keeps a row's scores in shared memory: past the 48 KiB every device gives
  // without opting in (about 12k positions), and for float64, the gather composition runs.
  const int64_t smem = (d + max_blocks * block_size) * static_cast<int64_t>(sizeof(float));
  if (smem > 48 * 1024 || q_in.scalar_type() == at::kDouble)
    return paged_attention_gather(q_in, key_cache, value_cache, block_tables, context_lens, scale, query_starts);
  const auto dt = kernel_dtype("paged_attention", q_in);
  c10::cuda::CUDAGuard guard(q_in.device());
  const at::Tensor q = q_in.contiguous(), tables = block_tables.contiguous(), lens = context_lens.contiguous();
  const at::Tensor starts = query_starts ? query_starts->contiguous() : at::Tensor();
  at::Tensor out = at::empty_like(q);
  if (out.numel() == 0 || tables.size(0) == 0) return out;
  cuda::paged_attention_forward(dt, q.const_data_ptr(), key_cache.const_data_ptr(), value_cache.const_data_ptr(),
                                tables.const_data_ptr<int64_t>(), lens.const_data_ptr<int64_t>(),
                                starts.defined() ? starts.const_data_ptr<int64_t>() : nullptr,
                                out.mutable_data_ptr(), tables.size(0), q.size(1), q.size(2), d, key_cache.size(1),
                                block_size, max_blocks, static_cast<float>(scale), current_stream());
  return out;
}

}  // namespace loom::ops

TORCH_LIBRARY_IMPL(loom, CUDA, m) {
  m.impl("layer_norm", &loom::ops::layer_norm_cuda);
  m.impl("layer_norm_backward", &loom::ops::layer_norm_backward_cuda);
  m.impl("dropout", &loom::ops::dropout_cuda);
  m.impl("dropout_mask", &loom::ops::dropout_mask_cuda);
  m.impl("bias_dropout_add", &loom::ops::bias_dropout_add_cuda);
  m.impl("scaled_masked_softmax", &loom::ops::scaled_masked_softmax_cuda);
  m.impl("scaled_masked_softmax_backward", &loom::ops::scaled_masked_softmax_backward_cuda);
  m.impl("paged_attention", &loom::ops::paged_attention_cuda);
  m.impl("bias_gelu", &loom::ops::bias_gelu_cuda);
  m.impl("bias_gelu_backward", &loom::ops::bias_gelu_backward_cuda);
  m.impl("rms_norm", &loom::ops::rms_norm_cuda);
  m.impl("rms_norm_backward", &loom::ops::rms_norm_backward_cuda);
  m.impl("rotary", &loom::ops::rotary_cuda);
  m.impl("rotary_backward", &loom::ops::rotary_backward_cuda);
  m.impl("swiglu", &loom::ops::swiglu_cuda);
  m.impl("swiglu_backward", &loom::ops::swiglu_backward_cuda);
}
