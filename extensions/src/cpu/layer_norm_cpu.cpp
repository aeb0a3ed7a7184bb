// LayerNorm and RMSNorm forward/backward on CPU: rows in parallel, each row converted once to
// the accumulation type (fp32, fp64 for fp64) and processed with ATen Vectorized. RMSNorm is
// LayerNorm with mean 0, no beta and no mean(g) term (kRms below), so one code serves both.
// Forward: two-pass mean and biased variance (no E[x^2] - mean^2 cancellation).
// Backward (xhat = (x - mean) rstd, g = dy * gamma):
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dgamma = sum dy*xhat, dbeta = sum dy
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <cmath>
#include <vector>

#include "internal.h"
#include "kernels.h"

namespace loom::ops {
namespace {

/// kRms: RMSNorm (mean 0, beta and mean null).
template <typename scalar_t, bool kRms = false>
void layer_norm_rows(const scalar_t* x, const at::opmath_type<scalar_t>* gamma,
                     const at::opmath_type<scalar_t>* beta, scalar_t* y,
                     at::opmath_type<scalar_t>* mean, at::opmath_type<scalar_t>* rstd,
                     int64_t rows, int64_t cols, double eps) {
  using acc_t = at::opmath_type<scalar_t>;
  using Vec = at::vec::Vectorized<acc_t>;
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(cols, 1));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> buf(cols);
    for (int64_t r = begin; r < end; ++r) {
      const scalar_t* xr = x + r * cols;
      for (int64_t j = 0; j < cols; ++j) buf[j] = static_cast<acc_t>(xr[j]);
      const acc_t mu = kRms ? acc_t(0)
                            : at::vec::reduce_all<acc_t>(
                                  [](Vec& a, Vec& b) { return a + b; }, buf.data(), cols) / cols;
      const acc_t var = at::vec::map_reduce_all<acc_t>(
                            [mu](Vec v) { v = v - Vec(mu); return v * v; },
                            [](Vec a, Vec b) { return a + b; }, buf.data(), cols) / cols;
      const acc_t rs = acc_t(1) / std::sqrt(var + static_cast<acc_t>(eps));
      if constexpr (kRms)
        at::vec::map2<acc_t>([rs](Vec v, Vec g) { return v * Vec(rs) * g; }, buf.data(),
                             buf.data(), gamma, cols);
      else
        at::vec::map3<acc_t>(
            [mu, rs](Vec v, Vec g, Vec b) { return (v - Vec(mu)) * Vec(rs) * g + b; },
            buf.data(), buf.data(), gamma, beta, cols);
      scalar_t* yr = y + r * cols;
      for (int64_t j = 0; j < cols; ++j) yr[j] = static_cast<scalar_t>(buf[j]);
      if (!kRms) mean[r] = mu;
      rstd[r] = rs;
    }
  });
}

/// kRms: RMSNorm (mean and dbeta null; no mean(g) term).
template <typename scalar_t, bool kRms = false>
void layer_norm_backward_rows(const scalar_t* dy, const scalar_t* x,
                              const at::opmath_type<scalar_t>* gamma,
                              const at::opmath_type<scalar_t>* mean,
                              const at::opmath_type<scalar_t>* rstd, scalar_t* dx,
                              at::opmath_type<scalar_t>* dgamma,
                              at::opmath_type<scalar_t>* dbeta, int64_t rows, int64_t cols) {
  using acc_t = at::opmath_type<scalar_t>;
  using Vec = at::vec::Vectorized<acc_t>;
  // Per-chunk partial sums of dgamma/dbeta, combined afterwards in chunk order.
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(cols, 1));
  const int64_t chunks = std::max<int64_t>(1, (rows + grain - 1) / grain);
  std::vector<acc_t> partial(2 * chunks * cols, acc_t(0));
  at::parallel_for(0, chunks, 1, [&](int64_t cbegin, int64_t cend) {
    std::vector<acc_t> xh(cols), g(cols);
    for (int64_t c = cbegin; c < cend; ++c) {
      acc_t* pg = partial.data() + 2 * c * cols;
      acc_t* pb = pg + cols;
      for (int64_t r = c * grain; r < std::min(rows, (c + 1) * grain); ++r) {
        const scalar_t* xr = x + r * cols;
        const scalar_t* dyr = dy + r * cols;
        const acc_t mu = kRms ? acc_t(0) : mean[r], rs = rstd[r];
        for (int64_t j = 0; j < cols; ++j) {
          const acc_t d = static_cast<acc_t>(dyr[j]);
          xh[j] = (static_cast<acc_t>(xr[j]) - mu) * rs;
          g[j] = d * gamma[j];
          pg[j] += d * xh[j];
          pb[j] += d;
        }
        const acc_t mean_g = kRms ? acc_t(0)
                                  : at::vec::reduce_all<acc_t>(
                                        [](Vec& a, Vec& b) { return a + b; }, g.data(), cols) / cols;
        const acc_t mean_gx = at::vec::map2_reduce_all<acc_t>(
                                  [](Vec a, Vec b) { return a * b; },
                                  [](Vec a, Vec b) { return a + b; }, g.data(), xh.data(),
                                  cols) / cols;
        at::vec::map2<acc_t>(
            [=](Vec gv, Vec xv) { return Vec(rs) * (gv - Vec(mean_g) - xv * Vec(mean_gx)); },
            g.data(), g.data(), xh.data(), cols);
        scalar_t* dxr = dx + r * cols;
        for (int64_t j = 0; j < cols; ++j) dxr[j] = static_cast<scalar_t>(g[j]);
      }
    }
  });
  for (int64_t j = 0; j < cols; ++j) {
    acc_t sg = 0, sb = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      sg += partial[2 * c * cols + j];
      sb += partial[(2 * c + 1) * cols + j];
    }
    dgamma[j] = sg;
    if (!kRms) dbeta[j] = sb;
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_cpu(const at::Tensor& x_in,
                                                              const at::Tensor& weight,
                                                              const at::Tensor& bias,
                                                              double eps) {
  internal::check_layer_norm(x_in, weight, bias);
  const at::Tensor x = x_in.contiguous();
  const int64_t cols = x.size(-1);
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  const auto sd = internal::acc_dtype(x.scalar_type());
  const at::Tensor gamma = internal::as_acc_param(weight, x.scalar_type());
  const at::Tensor beta = internal::as_acc_param(bias, x.scalar_type());
  at::Tensor y = at::empty_like(x);
  auto stat_shape = x.sizes().vec();
  stat_shape.pop_back();
  at::Tensor mean = at::empty(stat_shape, x.options().dtype(sd));
  at::Tensor rstd = at::empty(stat_shape, x.options().dtype(sd));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "loom_layer_norm", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    layer_norm_rows<scalar_t>(x.const_data_ptr<scalar_t>(), gamma.const_data_ptr<acc_t>(),
                              beta.const_data_ptr<acc_t>(), y.mutable_data_ptr<scalar_t>(),
                              mean.mutable_data_ptr<acc_t>(), rstd.mutable_data_ptr<acc_t>(),
                              rows, cols, eps);
  });
  return {y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_cpu(
    const at::Tensor& dy_in, const at::Tensor& x_in, const at::Tensor& weight,
    const at::Tensor& mean_in, const at::Tensor& rstd_in) {
  internal::check_layer_norm_backward(dy_in, x_in, weight, mean_in, rstd_in);
  const at::Tensor x = x_in.contiguous(), dy = dy_in.contiguous();
  const at::Tensor mean = mean_in.contiguous(), rstd = rstd_in.contiguous();
  const int64_t cols = x.size(-1);
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  const auto sd = internal::acc_dtype(x.scalar_type());
  const at::Tensor gamma = internal::as_acc_param(weight, x.scalar_type());
  at::Tensor dx = at::empty_like(x);
  at::Tensor dgamma = at::empty({cols}, x.options().dtype(sd));
  at::Tensor dbeta = at::empty({cols}, x.options().dtype(sd));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "loom_layer_norm_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    layer_norm_backward_rows<scalar_t>(
        dy.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(),
        gamma.const_data_ptr<acc_t>(), mean.const_data_ptr<acc_t>(),
        rstd.const_data_ptr<acc_t>(), dx.mutable_data_ptr<scalar_t>(),
        dgamma.mutable_data_ptr<acc_t>(), dbeta.mutable_data_ptr<acc_t>(), rows, cols);
  });
  return {dx, dgamma.to(weight.scalar_type()), dbeta.to(weight.scalar_type())};
}

std::tuple<at::Tensor, at::Tensor> rms_norm_cpu(const at::Tensor& x_in, const at::Tensor& weight,
                                                double eps) {
  internal::check_rms_norm(x_in, weight);
  const at::Tensor x = x_in.contiguous();
  const int64_t cols = x.size(-1);
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  const at::Tensor gamma = internal::as_acc_param(weight, x.scalar_type());
  at::Tensor y = at::empty_like(x);
  auto stat_shape = x.sizes().vec();
  stat_shape.pop_back();
  at::Tensor rstd = at::empty(stat_shape, x.options().dtype(internal::acc_dtype(x.scalar_type())));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "loom_rms_norm", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    layer_norm_rows<scalar_t, true>(x.const_data_ptr<scalar_t>(), gamma.const_data_ptr<acc_t>(),
                                    nullptr, y.mutable_data_ptr<scalar_t>(), nullptr,
                                    rstd.mutable_data_ptr<acc_t>(), rows, cols, eps);
  });
  return {y, rstd};
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cpu(const at::Tensor& dy_in,
                                                         const at::Tensor& x_in,
                                                         const at::Tensor& weight,
                                                         const at::Tensor& rstd_in) {
  internal::check_rms_norm_backward(dy_in, x_in, weight, rstd_in);
  const at::Tensor x = x_in.contiguous(), dy = dy_in.contiguous(), rstd = rstd_in.contiguous();
  const int64_t cols = x.size(-1);
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  const at::Tensor gamma = internal::as_acc_param(weight, x.scalar_type());
  at::Tensor dx = at::empty_like(x);
  at::Tensor dgamma = at::empty({cols}, x.options().dtype(internal::acc_dtype(x.scalar_type())));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "loom_rms_norm_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    layer_norm_backward_rows<scalar_t, true>(
        dy.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(), gamma.const_data_ptr<acc_t>(),
        nullptr, rstd.const_data_ptr<acc_t>(), dx.mutable_data_ptr<scalar_t>(),
        dgamma.mutable_data_ptr<acc_t>(), nullptr, rows, cols);
  });
  return {dx, dgamma.to(weight.scalar_type())};
}

}  // namespace loom::ops
