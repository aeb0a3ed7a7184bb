// scaled_masked_softmax against masked_fill + at::softmax, causal and explicit masks.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <limits>

#include "loom_ops/ops.h"
#include "ops_test_util.h"

namespace {

/// ATen reference in fp32: masked entries -inf, fully masked rows 0.
at::Tensor reference(const at::Tensor& x, const at::Tensor& masked, double scale) {
  at::Tensor s = (x.to(at::kFloat) * scale).masked_fill(masked, -std::numeric_limits<float>::infinity());
  return at::softmax(s, -1).nan_to_num(0.0);
}

at::Tensor causal_mask(int64_t sq, int64_t sk) {
  // key j masked for query i when j > i + sk - sq
  return at::ones({sq, sk}, at::kBool).triu(sk - sq + 1);
}

}  // namespace

TEST_CASE("scaled_masked_softmax matches the ATen composition", "[ops][softmax]") {
  at::manual_seed(31);
  const int64_t b = 2, a = 3, sq = 7, sk = 9;
  const double scale = 0.37;
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    CAPTURE(dtype);
    const at::Tensor x0 = (at::randn({b, a, sq, sk}) * 4).to(dtype);
    const at::Tensor g = at::randn({b, a, sq, sk}).to(dtype);
    // Explicit mask [b, 1, sq, sk] (padding style) with one fully masked row.
    at::Tensor mask = at::rand({b, 1, sq, sk}) < 0.3;
    mask.index_put_({0, 0, 2}, true);
    // fp32: exp/sum order differs from ATen's, ~1e-6 relative. bf16: output rounded once
    // (2^-9 relative), grads from rounded y and dy (~2^-8 relative of terms of size |g|).
    const bool f32 = dtype == at::kFloat;
    const double rtol = f32 ? 1e-5 : 1.0 / 128, atol = f32 ? 1e-6 : 1.0 / 128;
    for (int variant = 0; variant < 3; ++variant) {
      CAPTURE(variant);
      const bool causal = variant != 1;
      const std::optional<at::Tensor> m = variant >= 1 ? std::optional<at::Tensor>(mask) : std::nullopt;
      at::Tensor masked = at::zeros({b, a, sq, sk}, at::kBool);
      if (causal) masked = masked | causal_mask(sq, sk);
      if (m) masked = masked | mask;

      at::Tensor x = x0.clone().requires_grad_();
      at::Tensor y = loom::ops::scaled_masked_softmax(x, m, scale, causal);
      y.backward(g);
      at::Tensor xr = x0.to(at::kFloat).clone().requires_grad_();
      at::Tensor yr = reference(xr, masked, scale);
      yr.backward(g.to(at::kFloat));
      LOOM_CHECK_CLOSE(y, yr, rtol, atol);
      LOOM_CHECK_CLOSE(x.grad(), xr.grad(), rtol, atol);
      if (m) CHECK(y.select(0, 0).select(0, 0).select(0, 2).abs().sum().item<float>() == 0.0f);
    }
  }
}

TEST_CASE("scaled_masked_softmax rejects a mask that does not broadcast", "[ops][softmax]") {
  const at::Tensor x = at::randn({2, 4, 5});
  CHECK_THROWS_WITH(loom::ops::scaled_masked_softmax(x, at::zeros({3, 5}, at::kBool), 1.0, false),
                    Catch::Contains("does not broadcast"));
  CHECK_THROWS_WITH(loom::ops::scaled_masked_softmax(x, at::zeros({4, 5}), 1.0, false),
                    Catch::Contains("mask must be bool"));
}
