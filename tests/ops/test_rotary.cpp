// loom::rotary against the rotate-half ATen composition (csrc/model/rotary.cpp's definition,
// restated here): forward and input gradient, fp32 / bf16 / fp16, full and partial rotary, odd
// head widths, per-row and shared tables, and K as a strided view of one QKV tensor.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "loom_ops/ops.h"
#include "ops_test_util.h"

namespace {

at::Tensor rotary_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t r = cos.size(-1), half = r / 2;
  const at::Tensor xr = x.narrow(-1, 0, r);
  const at::Tensor rotated = at::cat({xr.narrow(-1, half, half).neg(), xr.narrow(-1, 0, half)}, -1);
  return at::cat({xr * cos + rotated * sin, x.narrow(-1, r, x.size(-1) - r)}, -1);
}

/// cos/sin tables [tb, 1, s, r] as Loom builds them: angles position · θ^(-2i/r), halves equal.
std::pair<at::Tensor, at::Tensor> tables(int64_t tb, int64_t s, int64_t r) {
  const at::Tensor pos = at::arange(s, at::kFloat).unsqueeze(0).expand({tb, s}) + at::arange(tb, at::kFloat).unsqueeze(1) * 3;
  const at::Tensor inv = at::pow(10000.0, at::arange(0, r, 2, at::kFloat) / static_cast<double>(r)).reciprocal();
  const at::Tensor ang = pos.unsqueeze(-1) * inv;
  const at::Tensor both = at::cat({ang, ang}, -1).unsqueeze(1);
  return {both.cos(), both.sin()};
}

}  // namespace

TEST_CASE("rotary matches the rotate-half composition forward and backward", "[ops][rotary]") {
  at::manual_seed(41);
  struct Case {
    int64_t b, heads, s, d, r, table_batches;
    bool strided;
    const char* what;
  };
  const Case cases[] = {
      {2, 3, 5, 16, 16, 2, false, "full rotary, per-row tables"},
      {2, 4, 6, 10, 6, 1, false, "partial rotary (6 of 10), shared tables"},
      {1, 2, 3, 7, 4, 1, false, "odd head width 7, 4 rotated"},
      {2, 4, 5, 8, 8, 2, true, "K as a strided view of a [s, b, groups, (2 + 2) d] QKV tensor"},
  };
  for (const Case& c : cases) {
    for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      CAPTURE(c.what, dtype);
      auto [cos32, sin32] = tables(c.table_batches, c.s, c.r);
      const at::Tensor cos = cos32.to(dtype), sin = sin32.to(dtype);
      at::Tensor x0;
      if (c.strided) {  // K of 4 groups of [2 q heads | k | v], as attention.cpp views it
        const at::Tensor mixed = at::randn({c.s, c.b, c.heads, 4 * c.d}).to(dtype);
        x0 = mixed.narrow(3, 2 * c.d, c.d).permute({1, 2, 0, 3});
        REQUIRE(!x0.is_contiguous());
      } else {
        x0 = at::randn({c.b, c.heads, c.s, c.d}).to(dtype);
      }
      const at::Tensor g = at::randn(x0.sizes()).to(dtype);
      at::Tensor x = x0.detach().requires_grad_();
      at::Tensor y = loom::ops::rotary(x, cos, sin);
      y.backward(g);
      REQUIRE(y.is_contiguous());
      at::Tensor xr = x0.to(at::kFloat).detach().requires_grad_();
      const at::Tensor yr = rotary_reference(xr, cos.to(at::kFloat), sin.to(at::kFloat));
      yr.backward(g.to(at::kFloat));
      const double rtol = dtype == at::kFloat ? 1e-6 : (dtype == at::kBFloat16 ? 1.0 / 128 : 1.0 / 1024);
      LOOM_CHECK_CLOSE(y, yr, rtol, 4 * rtol);
      LOOM_CHECK_CLOSE(x.grad(), xr.grad(), rtol, 4 * rtol);
    }
  }
}

TEST_CASE("rotary_backward is the rotation by minus the angle and rotary rejects bad tables",
          "[ops][rotary]") {
  at::manual_seed(42);
  auto [cos, sin] = tables(1, 4, 8);
  const at::Tensor x = at::randn({1, 2, 4, 8});
  // rotating by θ then by −θ (the backward with these tables) gives x back
  LOOM_CHECK_CLOSE(loom::ops::rotary_backward(loom::ops::rotary(x, cos, sin), cos, sin), x, 1e-5, 1e-6);
  LOOM_CHECK_CLOSE(loom::ops::rotary(x, cos, -sin), loom::ops::rotary_backward(x, cos, sin), 1e-6, 1e-7);

  CHECK_THROWS_WITH(loom::ops::rotary(x, cos.narrow(-1, 0, 7), sin.narrow(-1, 0, 7)),
                    Catch::Contains("must be even"));
  CHECK_THROWS_WITH(loom::ops::rotary(x, cos.narrow(2, 0, 3), sin), Catch::Contains("loom::rotary: cos must be [1 or 1, 1, 4, r]"));
  CHECK_THROWS_WITH(loom::ops::rotary(x, cos.to(at::kBFloat16), sin), Catch::Contains("cos must be Float"));
  CHECK_THROWS_WITH(loom::ops::rotary(x.reshape({2, 4, 8}), cos, sin), Catch::Contains("input must be [b, heads, s, d]"));
  CHECK_THROWS_WITH(loom::ops::rotary(x, cos.clone().requires_grad_(), sin),
                    Catch::Contains("cos and sin must not require grad"));
}
