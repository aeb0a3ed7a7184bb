// loom::swiglu against silu(gate) · up on Loom's interleaved [g₀, u₀, g₁, u₁, ...] fc1 output
// (csrc/model/mlp.h): forward and input gradient, fp32 / bf16 / fp16, odd widths.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "loom_ops/ops.h"
#include "ops_test_util.h"

namespace {

at::Tensor swiglu_reference(const at::Tensor& x) {
  const at::Tensor h = x.unflatten(-1, {x.size(-1) / 2, 2});
  return at::silu(h.select(-1, 0)) * h.select(-1, 1);
}

}  // namespace

TEST_CASE("swiglu matches silu(gate) times up forward and backward", "[ops][swiglu]") {
  at::manual_seed(51);
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (int64_t f : {688, 64, 3, 1}) {  // 688: more than one de-interleaved chunk per row
      CAPTURE(dtype, f);
      const at::Tensor x0 = (at::randn({5, 3, 2 * f}) * 3).to(dtype);
      const at::Tensor g = at::randn({5, 3, f}).to(dtype);
      at::Tensor x = x0.clone().requires_grad_();
      at::Tensor y = loom::ops::swiglu(x);
      y.backward(g);
      REQUIRE(y.sizes() == at::IntArrayRef{5, 3, f});
      at::Tensor xr = x0.to(at::kFloat).requires_grad_();
      const at::Tensor yr = swiglu_reference(xr);
      yr.backward(g.to(at::kFloat));
      const double rtol = dtype == at::kFloat ? 1e-5 : (dtype == at::kBFloat16 ? 1.0 / 128 : 1.0 / 1024);
      LOOM_CHECK_CLOSE(y, yr, rtol, dtype == at::kFloat ? 1e-6 : 4 * rtol);
      LOOM_CHECK_CLOSE(x.grad(), xr.grad(), rtol, dtype == at::kFloat ? 1e-6 : 4 * rtol);
    }
  }
}

TEST_CASE("swiglu rejects an odd last dimension and a mismatched gradient", "[ops][swiglu]") {
  const at::Tensor x = at::randn({4, 6});
  CHECK_THROWS_WITH(loom::ops::swiglu(at::randn({4, 5})), Catch::Contains("input must be [..., 2f]"));
  CHECK_THROWS_WITH(loom::ops::swiglu_backward(at::randn({4, 6}), x),
                    Catch::Contains("grad_out must be Float [4, 3]"));
}
