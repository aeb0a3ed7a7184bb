// loom::rms_norm against an fp32 ATen composition (forward, dx, dweight) in fp32, bf16 and
// fp16, with odd widths and float32 weights beside bf16 inputs.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "loom_ops/ops.h"
#include "ops_test_util.h"

namespace {

at::Tensor rms_norm_reference(const at::Tensor& x, const at::Tensor& w, double eps) {
  return x * (x.pow(2).mean(-1, /*keepdim=*/true) + eps).rsqrt() * w;
}

}  // namespace

TEST_CASE("rms_norm matches an ATen composition forward and backward", "[ops][rms_norm]") {
  at::manual_seed(31);
  const double eps = 1e-6;
  struct Case {
    at::ScalarType dtype, param_dtype;
  };
  for (const Case c : {Case{at::kFloat, at::kFloat}, Case{at::kBFloat16, at::kBFloat16},
                       Case{at::kBFloat16, at::kFloat}, Case{at::kHalf, at::kHalf}}) {
    for (int64_t h : {1000, 64, 7}) {
      CAPTURE(c.dtype, c.param_dtype, h);
      const at::Tensor x0 = (at::randn({6, 5, h}) * 3 + 0.5).to(c.dtype);
      const at::Tensor w0 = (at::randn({h}) * 0.5 + 1).to(c.param_dtype);
      const at::Tensor g = at::randn({6, 5, h}).to(c.dtype);

      at::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
      auto [y, rstd] = loom::ops::rms_norm_with_rstd(x, w, eps);
      y.backward(g);
      REQUIRE(y.scalar_type() == c.dtype);
      REQUIRE(rstd.scalar_type() == at::kFloat);
      REQUIRE(w.grad().scalar_type() == c.param_dtype);

      at::Tensor xr = x0.to(at::kFloat).requires_grad_(), wr = w0.to(at::kFloat).requires_grad_();
      rms_norm_reference(xr, wr, eps).backward(g.to(at::kFloat));
      const at::Tensor yr = rms_norm_reference(xr, wr, eps);
      LOOM_CHECK_CLOSE(rstd, (x0.to(at::kFloat).pow(2).mean(-1) + eps).rsqrt(), 1e-5, 1e-6);
      // fp32: summation order only. 16-bit outputs: one rounding of an fp32 value (2^-8 / 2^-11
      // relative) of |y| up to ~10.
      const bool f32 = c.dtype == at::kFloat;
      const double rtol = f32 ? 1e-5 : (c.dtype == at::kBFloat16 ? 1.0 / 128 : 1.0 / 1024);
      LOOM_CHECK_CLOSE(y, yr, rtol, f32 ? 1e-5 : 8 * rtol);
      LOOM_CHECK_CLOSE(x.grad(), xr.grad(), f32 ? 1e-4 : rtol, f32 ? 1e-5 : 8 * rtol);
      // dweight sums 30 rows; 16-bit weights are rounded once at the end.
      const bool p32 = c.param_dtype == at::kFloat;
      LOOM_CHECK_CLOSE(w.grad(), wr.grad(), p32 ? 1e-4 : rtol, p32 ? 1e-4 : 32 * rtol);
    }
  }
}

TEST_CASE("rms_norm_backward is callable directly and rejects bad arguments", "[ops][rms_norm]") {
  at::manual_seed(32);
  const at::Tensor x = at::randn({16, 48}) * 2, w = at::randn({48}), g = at::randn({16, 48});
  auto [y, rstd] = loom::ops::rms_norm_with_rstd(x, w, 1e-5);
  auto [dx, dw] = loom::ops::rms_norm_backward(g, x, w, rstd);
  at::Tensor xr = x.clone().requires_grad_(), wr = w.clone().requires_grad_();
  rms_norm_reference(xr, wr, 1e-5).backward(g);
  LOOM_CHECK_CLOSE(dx, xr.grad(), 1e-4, 1e-5);
  LOOM_CHECK_CLOSE(dw, wr.grad(), 1e-4, 1e-5);

  CHECK_THROWS_WITH(loom::ops::rms_norm(x, at::ones({47}), 1e-5),
                    Catch::Contains("loom::rms_norm: weight must have shape [48]"));
  CHECK_THROWS_WITH(loom::ops::rms_norm(x.to(at::kInt), w, 1e-5),
                    Catch::Contains("input must be float32"));
  CHECK_THROWS_WITH(loom::ops::rms_norm_backward(g, x, w, rstd.narrow(0, 0, 15)),
                    Catch::Contains("loom::rms_norm_backward: rstd must hold 16"));
}
