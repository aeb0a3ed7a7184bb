// Dropout, its keep mask and bias + dropout + residual on CPU. The mask bits come from
// loom_ops/philox.h (dropout_words / keep_threshold), the same code the CUDA kernels run,
// evaluated at each element's global index (dropout_layout.h).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <vector>

#include "internal.h"
#include "kernels.h"
#include "loom_ops/philox.h"

namespace loom::ops {
namespace {

/// Calls f(j, keep) for the n elements of a row whose first global index is g0.
template <typename F>
inline void for_each_keep(uint64_t seed, uint64_t stream, uint64_t threshold, int64_t g0,
                          int64_t n, F&& f) {
  if (threshold > 0xFFFFFFFFull) {  // p == 0: every word is below 2^32
    for (int64_t j = 0; j < n; ++j) f(j, true);
    return;
  }
  int64_t j = 0;
  while (j < n) {
    const uint64_t g = static_cast<uint64_t>(g0 + j);
    const PhiloxBlock w = dropout_words(seed, stream, g >> 2);
    for (unsigned lane = static_cast<unsigned>(g & 3); lane < 4 && j < n; ++lane, ++j)
      f(j, static_cast<uint64_t>(w.v[lane]) < threshold);
  }
}

/// out = residual + keep * scale * (x + bias) over rows of `layout`; bias and residual may
/// be null (then 0). All tensors contiguous with the layout's shape.
template <typename scalar_t>
void dropout_rows(const scalar_t* x, const at::opmath_type<scalar_t>* bias,
                  const scalar_t* residual, scalar_t* out, const ElementLayout& layout,
                  uint64_t seed, uint64_t stream, double p) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t cols = layout.row_length();
  int64_t rows = 1;
  for (int d = 0; d + 1 < layout.ndim; ++d) rows *= layout.sizes[d];
  if (cols == 0 || rows == 0) return;
  const uint64_t threshold = dropout_keep_threshold(p);
  // Same scale as the CUDA kernels for fp32/bf16/fp16; exact double for fp64.
  const acc_t scale = std::is_same_v<acc_t, double>
                          ? (p >= 1.0 ? 0.0 : 1.0 / (1.0 - p))
                          : static_cast<acc_t>(dropout_scale(p));
  const int64_t grain = std::max<int64_t>(1, 16384 / cols);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t base = r * cols;
      for_each_keep(seed, stream, threshold, layout.row_start(r), cols, [&](int64_t j, bool keep) {
        acc_t v = static_cast<acc_t>(x[base + j]);
        if (bias) v += bias[j];
        v = keep ? v * scale : acc_t(0);
        if (residual) v += static_cast<acc_t>(residual[base + j]);
        out[base + j] = static_cast<scalar_t>(v);
      });
    }
  });
}

}  // namespace

at::Tensor dropout_mask_cpu(const at::Tensor& like, double p, int64_t seed, int64_t stream,
                            at::IntArrayRef global_shape, at::IntArrayRef offset) {
  internal::check_probability("dropout_mask", p);
  const ElementLayout layout = internal::dropout_layout("dropout_mask", like, global_shape, offset);
  at::Tensor mask = at::empty(like.sizes(), like.options().dtype(at::kBool));
  if (mask.numel() == 0) return mask;
  bool* out = mask.mutable_data_ptr<bool>();
  const int64_t cols = layout.row_length();
  const int64_t rows = mask.numel() / cols;
  const uint64_t threshold = dropout_keep_threshold(p);
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for_each_keep(static_cast<uint64_t>(seed), static_cast<uint64_t>(stream), threshold,
                    layout.row_start(r), cols,
                    [&](int64_t j, bool keep) { out[r * cols + j] = keep; });
  });
  return mask;
}

at::Tensor dropout_cpu(const at::Tensor& x_in, double p, int64_t seed, int64_t stream,
                       at::IntArrayRef global_shape, at::IntArrayRef offset) {
  internal::check_floating("dropout", "input", x_in);
  internal::check_probability("dropout", p);
  const ElementLayout layout = internal::dropout_layout("dropout", x_in, global_shape, offset);
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "loom_dropout", [&] {
    dropout_rows<scalar_t>(x.const_data_ptr<scalar_t>(), nullptr, nullptr,
                           out.mutable_data_ptr<scalar_t>(), layout,
                           static_cast<uint64_t>(seed), static_cast<uint64_t>(stream), p);
  });
  return out;
}

at::Tensor bias_dropout_add_cpu(const at::Tensor& x_in, const std::optional<at::Tensor>& bias,
                                const at::Tensor& residual_in, double p, int64_t seed,
                                int64_t stream, at::IntArrayRef global_shape,
                                at::IntArrayRef offset) {
  internal::check_bias_dropout_add(x_in, bias, residual_in, p);
  const ElementLayout layout =
      internal::dropout_layout("bias_dropout_add", x_in, global_shape, offset);
  const at::Tensor x = x_in.contiguous(), residual = residual_in.contiguous();
  at::Tensor b;
  if (bias) b = internal::as_acc_param(*bias, x.scalar_type());
  at::Tensor out = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "loom_bias_dropout_add", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    dropout_rows<scalar_t>(x.const_data_ptr<scalar_t>(),
                           b.defined() ? b.const_data_ptr<acc_t>() : nullptr,
                           residual.const_data_ptr<scalar_t>(),
                           out.mutable_data_ptr<scalar_t>(), layout,
                           static_cast<uint64_t>(seed), static_cast<uint64_t>(stream), p);
  });
  return out;
}

}  // namespace loom::ops
