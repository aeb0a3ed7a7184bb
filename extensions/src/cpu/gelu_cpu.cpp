// Bias + GeLU (tanh approximation, Hendrycks & Gimpel 2016; Megatron's bias_gelu) on CPU:
//   u = x + b,  y = 0.5 u (1 + tanh(k (u + c u^3))),  k = sqrt(2/pi), c = 0.044715
//   dy/du = 0.5 (1 + t) + 0.5 u (1 - t^2) k (1 + 3 c u^2),  t = tanh(k (u + c u^3))
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <cmath>

#include "internal.h"
#include "kernels.h"

namespace loom::ops {
namespace {

constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;

template <typename acc_t>
inline acc_t gelu_tanh(acc_t u) {
  const acc_t t = std::tanh(acc_t(kSqrt2OverPi) * (u + acc_t(kGeluCubic) * u * u * u));
  return acc_t(0.5) * u * (acc_t(1) + t);
}

template <typename acc_t>
inline acc_t gelu_tanh_grad(acc_t u) {
  const acc_t k = acc_t(kSqrt2OverPi), c = acc_t(kGeluCubic);
  const acc_t t = std::tanh(k * (u + c * u * u * u));
  return acc_t(0.5) * (acc_t(1) + t) +
         acc_t(0.5) * u * (acc_t(1) - t * t) * k * (acc_t(1) + acc_t(3) * c * u * u);
}

}  // namespace

at::Tensor bias_gelu_cpu(const at::Tensor& x_in, const at::Tensor& bias) {
  internal::check_bias_gelu(x_in, bias);
  const at::Tensor x = x_in.contiguous();
  const at::Tensor b = internal::as_acc_param(bias, x.scalar_type());
  at::Tensor y = at::empty_like(x);
  const int64_t cols = x.size(-1);
  if (x.numel() == 0) return y;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "loom_bias_gelu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const acc_t* bp = b.const_data_ptr<acc_t>();
    scalar_t* yp = y.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, x.numel(), 32768, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        yp[i] = static_cast<scalar_t>(gelu_tanh<acc_t>(static_cast<acc_t>(xp[i]) + bp[i % cols]));
    });
  });
  return y;
}

at::Tensor bias_gelu_backward_cpu(const at::Tensor& dy_in, const at::Tensor& x_in,
                                  const at::Tensor& bias) {
  internal::check_bias_gelu(x_in, bias);
  TORCH_CHECK(dy_in.sizes() == x_in.sizes() && dy_in.scalar_type() == x_in.scalar_type(),
              "loom::bias_gelu_backward: grad_out must match the input (", x_in.sizes(), ", ",
              x_in.scalar_type(), "), got ", dy_in.sizes(), ", ", dy_in.scalar_type());
  const at::Tensor x = x_in.contiguous(), dy = dy_in.contiguous();
  const at::Tensor b = internal::as_acc_param(bias, x.scalar_type());
  at::Tensor dx = at::empty_like(x);
  const int64_t cols = x.size(-1);
  if (x.numel() == 0) return dx;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "loom_bias_gelu_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* gp = dy.const_data_ptr<scalar_t>();
    const acc_t* bp = b.const_data_ptr<acc_t>();
    scalar_t* dxp = dx.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, x.numel(), 32768, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        dxp[i] = static_cast<scalar_t>(static_cast<acc_t>(gp[i]) *
                                       gelu_tanh_grad<acc_t>(static_cast<acc_t>(xp[i]) + bp[i % cols]));
    });
  });
  return dx;
}

}  // namespace loom::ops
