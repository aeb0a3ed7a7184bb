// Dropout, its mask and bias_dropout_add: mask bits equal the scalar Philox definition at
// each element's global index, are the same for every split of the global tensor, and the
// ops equal ATen compositions using that mask (forward and backward).
#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <cmath>

#include "loom_ops/ops.h"
#include "ops_test_util.h"

using loom::ops::DropoutSpec;

namespace {

DropoutSpec spec(double p, uint64_t seed, uint64_t stream,
                 loom::ops::GlobalBlock block = {}) {
  DropoutSpec s;
  s.p = p;
  s.key = {seed, stream};
  s.block = std::move(block);
  return s;
}

}  // namespace

TEST_CASE("dropout mask bits are the Philox keying at global indices", "[ops][dropout]") {
  // Local [3, 2, 5] at offset [4, 1, 2] of global [9, 4, 11].
  const std::vector<int64_t> global{9, 4, 11}, offset{4, 1, 2};
  const double p = 0.3;
  const uint64_t seed = 0x1234567890abcdefull, stream = loom::ops::make_dropout_stream(7, 2, 3);
  const at::Tensor like = at::empty({3, 2, 5});
  const at::Tensor mask = loom::ops::dropout_keep_mask(like, spec(p, seed, stream, {global, offset}));
  REQUIRE(mask.scalar_type() == at::kBool);
  const auto acc = mask.accessor<bool, 3>();
  const uint64_t thr = loom::ops::dropout_keep_threshold(p);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 2; ++j)
      for (int64_t k = 0; k < 5; ++k) {
        const uint64_t g = ((i + 4) * 4 + (j + 1)) * 11 + (k + 2);
        CHECK(acc[i][j][k] == loom::ops::dropout_keep(seed, stream, g, thr));
      }
}

TEST_CASE("dropout masks do not depend on how the global tensor is split", "[ops][dropout]") {
  const int64_t S = 12, B = 4, H = 24;
  const auto s = spec(0.25, 42, loom::ops::make_dropout_stream(3, 1, loom::ops::kDropoutSiteMlpOutput));
  const at::Tensor full = loom::ops::dropout_keep_mask(at::empty({S, B, H}), s);
  SECTION("sequence shards (SP ranks) and micro-batches") {
    for (int64_t t : {2, 3, 4}) {
      for (int64_t r = 0; r < t; ++r) {
        for (int64_t b0 = 0; b0 < B; b0 += 2) {
          auto shard = s;
          shard.block = {{S, B, H}, {r * S / t, b0, 0}};
          const at::Tensor m = loom::ops::dropout_keep_mask(at::empty({S / t, 2, H}), shard);
          CHECK(at::equal(m, full.slice(0, r * S / t, (r + 1) * S / t).slice(1, b0, b0 + 2)));
        }
      }
    }
  }
  SECTION("attention heads split over TP ranks") {
    const int64_t A = 6, T = 5;
    auto sa = s;
    const at::Tensor probs_full = loom::ops::dropout_keep_mask(at::empty({B, A, T, T}), sa);
    for (int64_t r = 0; r < 3; ++r) {
      sa.block = {{B, A, T, T}, {0, r * 2, 0, 0}};
      const at::Tensor m = loom::ops::dropout_keep_mask(at::empty({B, 2, T, T}), sa);
      CHECK(at::equal(m, probs_full.slice(1, 2 * r, 2 * r + 2)));
    }
  }
  SECTION("different seeds, streams and global shapes give different masks") {
    auto other = s;
    other.key.stream += 1;
    CHECK_FALSE(at::equal(full, loom::ops::dropout_keep_mask(at::empty({S, B, H}), other)));
    other = s;
    other.key.seed += 1;
    CHECK_FALSE(at::equal(full, loom::ops::dropout_keep_mask(at::empty({S, B, H}), other)));
  }
}

TEST_CASE("dropout keeps a fraction 1 - p of the elements", "[ops][dropout]") {
  const int64_t n = 1 << 18;
  for (double p : {0.1, 0.5, 0.9}) {
    const at::Tensor m = loom::ops::dropout_keep_mask(at::empty({n / 512, 512}), spec(p, 9, 1));
    const double kept = m.sum().item<double>() / n;
    // Binomial(n, 1-p): 6 standard deviations.
    CHECK(std::abs(kept - (1 - p)) < 6 * std::sqrt(p * (1 - p) / n));
  }
  CHECK(loom::ops::dropout_keep_mask(at::empty({100}), spec(0.0, 1, 1)).all().item<bool>());
  CHECK_FALSE(loom::ops::dropout_keep_mask(at::empty({100}), spec(1.0, 1, 1)).any().item<bool>());
}

TEST_CASE("dropout equals x * mask / (1 - p), forward and backward", "[ops][dropout]") {
  at::manual_seed(11);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    const auto s = spec(0.2, 5, 6, {{8, 4, 64}, {2, 0, 0}});
    const at::Tensor x = at::randn({3, 4, 64}).to(dtype).requires_grad_();
    const at::Tensor y = loom::ops::dropout(x, s);
    const at::Tensor mask = loom::ops::dropout_keep_mask(x, s);
    // Reference in fp32 from the same inputs; loom scales in fp32 and rounds once, so bf16
    // results are within half a bf16 ulp (2^-9 relative) of it.
    const double rtol = dtype == at::kFloat ? 1e-6 : 1.0 / 256;
    const at::Tensor ref = x.detach().to(at::kFloat) * mask / 0.8;
    LOOM_CHECK_CLOSE(y, ref, rtol, 0.0);
    const at::Tensor g = at::randn({3, 4, 64}).to(dtype);
    y.backward(g);
    LOOM_CHECK_CLOSE(x.grad(), g.to(at::kFloat) * mask / 0.8, rtol, 0.0);
  }
}

TEST_CASE("bias_dropout_add equals residual + dropout(x + bias)", "[ops][dropout]") {
  at::manual_seed(12);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    const int64_t s_len = 6, b = 3, h = 40;
    const auto s = spec(0.1, 77, loom::ops::make_dropout_stream(1, 4, 2), {{12, 3, 40}, {6, 0, 0}});
    const at::Tensor x = at::randn({s_len, b, h}).to(dtype).requires_grad_();
    const at::Tensor bias = at::randn({h}).to(dtype).requires_grad_();
    const at::Tensor res = at::randn({s_len, b, h}).to(dtype).requires_grad_();
    const at::Tensor out = loom::ops::bias_dropout_add(x, bias, res, s);
    const at::Tensor mask = loom::ops::dropout_keep_mask(x, s);
    // fp32 reference from the same inputs; loom computes in fp32 and rounds once (bf16:
    // 2^-9 relative; the sum can cancel, so also an absolute 2^-8 of the inputs' scale).
    const at::Tensor xr = x.detach().to(at::kFloat), br = bias.detach().to(at::kFloat);
    const at::Tensor ref = res.detach().to(at::kFloat) + (xr + br) * mask / 0.9;
    const double rtol = dtype == at::kFloat ? 1e-6 : 1.0 / 256;
    const double atol = dtype == at::kFloat ? 1e-6 : 1.0 / 128;
    LOOM_CHECK_CLOSE(out, ref, rtol, atol);

    const at::Tensor g = at::randn({s_len, b, h}).to(dtype);
    out.backward(g);
    const at::Tensor gx = g.to(at::kFloat) * mask / 0.9;
    LOOM_CHECK_CLOSE(x.grad(), gx, rtol, atol);
    LOOM_CHECK_CLOSE(res.grad(), g, 0.0, 0.0);
    // d bias sums s*b = 18 rounded terms (bf16: the grad itself is rounded, ~2^-8 each).
    LOOM_CHECK_CLOSE(bias.grad(), gx.to(dtype).to(at::kFloat).sum(at::IntArrayRef{0, 1}), dtype == at::kFloat ? 1e-5 : 1e-2,
                     dtype == at::kFloat ? 1e-5 : 2e-2);
  }
}

TEST_CASE("bias_dropout_add without bias and with p = 0 is a plain residual add", "[ops][dropout]") {
  at::manual_seed(13);
  const at::Tensor x = at::randn({5, 7});
  const at::Tensor r = at::randn({5, 7});
  LOOM_CHECK_CLOSE(loom::ops::bias_dropout_add(x, std::nullopt, r, spec(0.0, 1, 2)), x + r, 1e-7, 0.0);
  CHECK(at::equal(loom::ops::bias_dropout_add(x, std::nullopt, r, spec(1.0, 1, 2)), r));
}

TEST_CASE("dropout rejects bad arguments with clear errors", "[ops][dropout]") {
  const at::Tensor x = at::randn({4, 8});
  CHECK_THROWS_WITH(loom::ops::dropout(x, spec(1.5, 1, 1)), Catch::Contains("probability must be in [0, 1]"));
  CHECK_THROWS_WITH(loom::ops::dropout(x, spec(0.1, 1, 1, {{4, 8}, {1, 0}})),
                    Catch::Contains("exceeds the global size"));
  CHECK_THROWS_WITH(loom::ops::bias_dropout_add(x, at::randn({7}), x, spec(0.1, 1, 1)),
                    Catch::Contains("bias must have shape [8]"));
}
