// core_attention (selective recomputation as one op) against the ATen composition
// softmax(q kᵀ scale + mask) * keep / (1 - p) @ v, forward and every gradient; and the
// same result when the heads are split over tensor-parallel ranks.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <limits>

#include "loom_ops/ops.h"
#include "ops_test_util.h"

namespace {

at::Tensor reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& keep, double p, double scale) {
  const int64_t sq = q.size(-2), sk = k.size(-2);
  at::Tensor s = at::matmul(q, k.transpose(-2, -1)) * scale;
  s = s.masked_fill(at::ones({sq, sk}, at::kBool).triu(sk - sq + 1),
                    -std::numeric_limits<float>::infinity());
  return at::matmul(at::softmax(s, -1) * keep / (1 - p), v);
}

}  // namespace

TEST_CASE("core_attention matches the ATen composition", "[ops][attention]") {
  at::manual_seed(41);
  const int64_t b = 2, a = 4, s = 8, d = 16;
  const double scale = 1.0 / 4.0, p = 0.15;
  loom::ops::DropoutSpec spec;
  spec.p = p;
  spec.key = {1234, loom::ops::make_dropout_stream(2, 5, loom::ops::kDropoutSiteAttentionProbs)};
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    CAPTURE(dtype);
    const at::Tensor q0 = at::randn({b, a, s, d}).to(dtype), k0 = at::randn({b, a, s, d}).to(dtype),
                     v0 = at::randn({b, a, s, d}).to(dtype), g = at::randn({b, a, s, d}).to(dtype);
    at::Tensor q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_(),
               v = v0.clone().requires_grad_();
    at::Tensor out = loom::ops::core_attention(q, k, v, std::nullopt, scale, true, spec);
    out.backward(g);
    const at::Tensor keep = loom::ops::dropout_keep_mask(at::empty({b, a, s, s}), spec);

    at::Tensor qr = q0.to(at::kFloat).clone().requires_grad_(), kr = k0.to(at::kFloat).clone().requires_grad_(),
               vr = v0.to(at::kFloat).clone().requires_grad_();
    at::Tensor ref = reference(qr, kr, vr, keep, p, scale);
    ref.backward(g.to(at::kFloat));
    // fp32: GEMM + softmax reassociation, ~1e-5. bf16: scores, probabilities and GEMM
    // outputs are each rounded to bf16 (2^-9 relative) and errors add over d = 16 and
    // s = 8 terms of size ~1, so a few 1e-2 absolute.
    const bool f32 = dtype == at::kFloat;
    const double rtol = f32 ? 1e-4 : 3e-2, atol = f32 ? 1e-5 : 5e-2;
    LOOM_CHECK_CLOSE(out, ref, rtol, atol);
    LOOM_CHECK_CLOSE(q.grad(), qr.grad(), rtol, atol);
    LOOM_CHECK_CLOSE(k.grad(), kr.grad(), rtol, atol);
    LOOM_CHECK_CLOSE(v.grad(), vr.grad(), rtol, atol);
  }
}

TEST_CASE("core_attention with heads split over ranks equals the full result", "[ops][attention]") {
  at::manual_seed(42);
  const int64_t b = 2, a = 6, s = 5, d = 8, t = 3;
  const at::Tensor q = at::randn({b, a, s, d}), k = at::randn({b, a, s, d}), v = at::randn({b, a, s, d});
  loom::ops::DropoutSpec full;
  full.p = 0.3;
  full.key = {99, 7};
  const at::Tensor want = loom::ops::core_attention(q, k, v, std::nullopt, 0.3, true, full);
  for (int64_t r = 0; r < t; ++r) {
    auto shard = full;
    shard.block = {{b, a, s, s}, {0, r * a / t, 0, 0}};
    auto part = [&](const at::Tensor& x) { return x.slice(1, r * a / t, (r + 1) * a / t); };
    const at::Tensor got = loom::ops::core_attention(part(q), part(k), part(v), std::nullopt, 0.3, true, shard);
    LOOM_CHECK_CLOSE(got, part(want), 1e-6, 1e-6);
  }
}

TEST_CASE("core_attention accepts an explicit padding mask", "[ops][attention]") {
  at::manual_seed(43);
  const at::Tensor q = at::randn({1, 2, 4, 8}), k = at::randn({1, 2, 6, 8}), v = at::randn({1, 2, 6, 8});
  at::Tensor mask = at::zeros({1, 1, 4, 6}, at::kBool);
  mask.slice(-1, 4, 6).fill_(true);  // last two keys are padding
  loom::ops::DropoutSpec none;  // p = 0
  const at::Tensor out = loom::ops::core_attention(q, k, v, mask, 0.5, false, none);
  const at::Tensor ref = at::matmul(at::softmax(at::matmul(q, k.transpose(-2, -1)).slice(-1, 0, 4) * 0.5, -1),
                                    v.slice(-2, 0, 4));
  LOOM_CHECK_CLOSE(out, ref, 1e-5, 1e-6);
}
