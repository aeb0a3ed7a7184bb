// bias_gelu against at::gelu(x + b, "tanh") in float64, forward and backward.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <tuple>
#include <torch/torch.h>

#include "loom_ops/ops.h"
#include "ops_test_util.h"

TEST_CASE("bias_gelu matches at::gelu(x + bias, tanh)", "[ops][gelu][isa]") {
  at::manual_seed(51);
  // 100 and 98 columns: tails after 16, 8 and 4 lanes; the spread of 40 reaches both exp clamps.
  for (auto [dtype, cols, spread] :
       {std::tuple{at::kFloat, 96, 2.0}, {at::kBFloat16, 96, 2.0}, {at::kFloat, 100, 40.0}, {at::kFloat, 98, 3.0}}) {
    CAPTURE(dtype, cols, spread);
    const at::Tensor x0 = (at::randn({7, 3, cols}) * spread).to(dtype), b0 = at::randn({cols}).to(dtype);
    const at::Tensor g = at::randn({7, 3, cols}).to(dtype);
    at::Tensor x = x0.clone().requires_grad_(), b = b0.clone().requires_grad_();
    at::Tensor y = loom::ops::bias_gelu(x, b);
    y.backward(g);
    // The reference in float64: ATen's fp32 tanh form itself loses ~1e-6 to cancellation (1 + tanh
    // for negative inputs) in the gradient.
    at::Tensor xr = x0.to(at::kDouble).clone().requires_grad_(), br = b0.to(at::kDouble).clone().requires_grad_();
    at::Tensor yr = at::gelu(xr + br, "tanh");
    yr.backward(g.to(at::kDouble));
    // fp32: a few ulp. bf16: one rounding of an fp32 value.
    const bool f32 = dtype == at::kFloat;
    LOOM_CHECK_CLOSE(y, yr, f32 ? 1e-5 : 1.0 / 256, f32 ? 1e-6 : 1.0 / 256);
    LOOM_CHECK_CLOSE(x.grad(), xr.grad(), f32 ? 1e-5 : 1.0 / 256, f32 ? 1e-6 : 1.0 / 256);
    // d bias sums 21 rows (bf16: of rounded terms).
    LOOM_CHECK_CLOSE(b.grad(), br.grad(), f32 ? 1e-5 : 1.0 / 64, f32 ? 1e-5 : 1.0 / 32);
  }
}
