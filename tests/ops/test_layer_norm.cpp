// loom::layer_norm against at::layer_norm (forward, dx, dgamma, dbeta) in fp32 and bf16.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "loom_ops/ops.h"
#include "ops_test_util.h"

namespace {

struct LnCase {
  at::ScalarType dtype;
  at::ScalarType param_dtype;
};

}  // namespace

TEST_CASE("layer_norm matches at::layer_norm forward and backward", "[ops][layer_norm]") {
  at::manual_seed(21);
  const double eps = 1e-5;
  for (const LnCase c : {LnCase{at::kFloat, at::kFloat}, LnCase{at::kBFloat16, at::kBFloat16},
                         LnCase{at::kBFloat16, at::kFloat}}) {
    for (int64_t h : {1000, 64, 3}) {
      CAPTURE(c.dtype, c.param_dtype, h);
      // Non-zero mean and scale so the normalisation is exercised.
      const at::Tensor x0 = (at::randn({6, 5, h}) * 3 + 1.5).to(c.dtype);
      const at::Tensor w0 = (at::randn({h}) * 0.5 + 1).to(c.param_dtype);
      const at::Tensor b0 = at::randn({h}).to(c.param_dtype);
      const at::Tensor g = at::randn({6, 5, h}).to(c.dtype);

      at::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_(),
                 b = b0.clone().requires_grad_();
      auto [y, mean, rstd] = loom::ops::layer_norm_with_stats(x, w, b, eps);
      y.backward(g);
      REQUIRE(mean.scalar_type() == at::kFloat);
      REQUIRE(y.scalar_type() == c.dtype);
      REQUIRE(w.grad().scalar_type() == c.param_dtype);

      // Reference: ATen in fp32 from the same (rounded) inputs.
      at::Tensor xr = x0.to(at::kFloat).clone().requires_grad_(), wr = w0.to(at::kFloat).clone().requires_grad_(),
                 br = b0.to(at::kFloat).clone().requires_grad_();
      at::Tensor yr = at::layer_norm(xr, {h}, wr, br, eps);
      yr.backward(g.to(at::kFloat));
      const at::Tensor x32 = x0.to(at::kFloat);
      LOOM_CHECK_CLOSE(mean, x32.mean(-1), 1e-5, 1e-5);
      LOOM_CHECK_CLOSE(rstd, (x32.var(-1, /*unbiased=*/false) + eps).rsqrt(), 1e-4, 1e-6);
      // fp32: both sides fp32 with different summation order over h <= 1000 terms -> ~1e-5.
      // bf16 output: one rounding of an fp32 value, 2^-9 relative; |y| ~ 3 so atol 2^-6.
      const bool f32 = c.dtype == at::kFloat;
      LOOM_CHECK_CLOSE(y, yr, f32 ? 1e-5 : 1.0 / 256, f32 ? 1e-5 : 1.0 / 64);
      LOOM_CHECK_CLOSE(x.grad(), xr.grad(), f32 ? 1e-4 : 1.0 / 128, f32 ? 1e-5 : 1.0 / 64);
      // dgamma/dbeta sum 30 rows; bf16 params are rounded once at the end.
      const bool p32 = c.param_dtype == at::kFloat;
      LOOM_CHECK_CLOSE(w.grad(), wr.grad(), p32 ? 1e-4 : 1.0 / 128, p32 ? 1e-4 : 1.0 / 32);
      LOOM_CHECK_CLOSE(b.grad(), br.grad(), p32 ? 1e-4 : 1.0 / 128, p32 ? 1e-4 : 1.0 / 32);
    }
  }
}

TEST_CASE("layer_norm_backward is callable directly with saved statistics", "[ops][layer_norm]") {
  at::manual_seed(22);
  const at::Tensor x = at::randn({16, 48}) * 2 - 0.5, w = at::randn({48}), b = at::randn({48});
  const at::Tensor g = at::randn({16, 48});
  auto [y, mean, rstd] = loom::ops::layer_norm_with_stats(x, w, b, 1e-6);
  auto [dx, dw, db] = loom::ops::layer_norm_backward(g, x, w, mean, rstd);
  auto ref = at::native_layer_norm_backward(g, x, {48}, mean.unsqueeze(-1), rstd.unsqueeze(-1), w, b,
                                            {true, true, true});
  LOOM_CHECK_CLOSE(dx, std::get<0>(ref), 1e-4, 1e-5);
  LOOM_CHECK_CLOSE(dw, std::get<1>(ref), 1e-4, 1e-5);
  LOOM_CHECK_CLOSE(db, std::get<2>(ref), 1e-4, 1e-5);
}

TEST_CASE("layer_norm rejects mismatched parameters", "[ops][layer_norm]") {
  const at::Tensor x = at::randn({4, 8});
  CHECK_THROWS_WITH(loom::ops::layer_norm(x, at::ones({7}), at::zeros({8}), 1e-5),
                    Catch::Contains("weight must have shape [8]"));
  CHECK_THROWS_WITH(loom::ops::layer_norm(x, at::ones({8}, at::kDouble), at::zeros({8}), 1e-5),
                    Catch::Contains("weight must be"));
  CHECK_THROWS_WITH(loom::ops::layer_norm(x.to(at::kInt), at::ones({8}), at::zeros({8}), 1e-5),
                    Catch::Contains("input must be float32"));
}
