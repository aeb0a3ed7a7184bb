// The sampling rules (generate/sampling_batch.h, one row as `loom generate` samples) against
// the formulas: softmax(l / T), top-k, nucleus (smallest most-probable set reaching p),
// renormalisation; empirical frequencies with a TokenSampler's uniforms; greedy and
// top-k = 1; seeds; bad options and logits.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <cmath>
#include <random>

#include "generate/sampling.h"
#include "generate/sampling_batch.h"

using loom::generate::SampleRow;
using loom::generate::SamplingOptions;
using loom::generate::TokenSampler;

namespace {

std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(static_cast<float>(std::log(p)));
  return out;
}

std::vector<float> random_logits(uint64_t seed, int n) {
  std::mt19937 gen(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> out(n);
  for (auto& x : out) x = normal(gen);
  return out;
}

SamplingOptions opts(double temperature, int64_t top_k, double top_p, uint64_t seed = 7) {
  SamplingOptions o;
  o.temperature = temperature;
  o.top_k = top_k;
  o.top_p = top_p;
  o.seed = seed;
  return o;
}

at::Tensor row_of(const std::vector<float>& logits) {
  return at::tensor(logits).view({1, static_cast<int64_t>(logits.size())});  // host: test input
}

// The distribution one row with options `o` draws from (id order).
std::vector<double> distribution(const SamplingOptions& o, const std::vector<float>& logits) {
  SampleRow r;
  r.options = o;
  const at::Tensor d = loom::generate::sampling_probabilities(row_of(logits), {r}).contiguous();
  return {d.data_ptr<double>(), d.data_ptr<double>() + d.numel()};
}

// The token one row chooses, its uniform drawn from `s` unless greedy.
int64_t next(TokenSampler& s, const SamplingOptions& o, const std::vector<float>& logits) {
  SampleRow r;
  r.options = o;
  r.uniform = o.greedy ? 0.0 : s.draw_uniform();
  const auto got = loom::generate::sample_rows(row_of(logits), {r});
  REQUIRE(got.errors[0].empty());
  return got.tokens[0];
}

int64_t first_token(const SamplingOptions& o, const std::vector<float>& logits) {
  TokenSampler s(o);
  return next(s, o, logits);
}

}  // namespace

TEST_CASE("sampling distribution follows temperature, top-k and top-p") {
  const auto logits = logits_of({0.05, 0.5, 0.15, 0.3});  // sorted: 1, 3, 2, 0
  SECTION("temperature: softmax(l / T)") {
    for (double t : {1.0, 0.5, 2.0}) {
      auto d = distribution(opts(t, 0, 1.0), logits);
      double z = 0;
      for (float l : logits) z += std::exp(l / t);
      for (int i = 0; i < 4; ++i) CHECK(d[i] == Approx(std::exp(logits[i] / t) / z).epsilon(1e-6));
    }
  }
  SECTION("top-k keeps the k most probable, renormalised") {
    auto d = distribution(opts(1.0, 2, 1.0), logits);
    CHECK(d[1] == Approx(0.5 / 0.8).epsilon(1e-6));
    CHECK(d[3] == Approx(0.3 / 0.8).epsilon(1e-6));
    CHECK(d[0] == 0.0);
    CHECK(d[2] == 0.0);
  }
  SECTION("top-p keeps the smallest most-probable set reaching p") {
    // Cumulative 0.5, 0.8, 0.95, 1.0: p = 0.7 needs {1, 3}; p = 0.9 needs {1, 3, 2}; p = 0.4 {1}.
    auto d = distribution(opts(1.0, 0, 0.7), logits);
    CHECK(d[1] == Approx(0.625).epsilon(1e-6));
    CHECK(d[3] == Approx(0.375).epsilon(1e-6));
    CHECK(d[0] + d[2] == 0.0);
    d = distribution(opts(1.0, 0, 0.9), logits);
    CHECK(d[2] == Approx(0.15 / 0.95).epsilon(1e-6));
    CHECK(d[0] == 0.0);
    d = distribution(opts(1.0, 0, 0.4), logits);
    CHECK(d[1] == 1.0);
  }
  SECTION("top-k then top-p, after the temperature") {
    // T = 0.5 squares the odds: 0.25, 0.09, 0.0225, 0.0025 (sum 0.365); top-2 leaves
    // 0.25/0.34 = 0.735 and 0.265; p = 0.7 then keeps only the first.
    auto d = distribution(opts(0.5, 2, 0.7), logits);
    CHECK(d[1] == 1.0);
    d = distribution(opts(0.5, 2, 0.8), logits);
    CHECK(d[1] == Approx(0.25 / 0.34).epsilon(1e-6));
    CHECK(d[3] == Approx(0.09 / 0.34).epsilon(1e-6));
  }
}

TEST_CASE("sampled frequencies match the distribution") {
  const auto logits = logits_of({0.05, 0.5, 0.15, 0.3});
  for (const auto& o : {opts(1.0, 0, 1.0, 3), opts(0.8, 3, 0.9, 4)}) {
    TokenSampler s(o);
    const auto want = distribution(o, logits);
    const int n = 40000;
    std::vector<int> count(4, 0);
    // n draws in one batched call, each row with the sampler's next uniform.
    std::vector<SampleRow> rows(n);
    for (auto& r : rows) {
      r.options = o;
      r.uniform = s.draw_uniform();
    }
    const auto got = loom::generate::sample_rows(row_of(logits).repeat({n, 1}), rows);
    for (int64_t t : got.tokens) ++count[t];
    for (int i = 0; i < 4; ++i) {
      const double sd = std::sqrt(want[i] * (1 - want[i]) / n);
      INFO("token " << i << " want " << want[i] << " got " << double(count[i]) / n);
      CHECK(std::abs(double(count[i]) / n - want[i]) <= 4 * sd + 1e-12);
    }
  }
}

TEST_CASE("greedy and top-k = 1 pick the argmax, lowest id among ties") {
  SamplingOptions greedy;
  greedy.greedy = true;
  CHECK(first_token(greedy, {0.1f, 3.0f, -2.0f, 3.0f}) == 1);
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const auto logits = random_logits(seed, 300);
    const int64_t want = std::max_element(logits.begin(), logits.end()) - logits.begin();
    CHECK(first_token(greedy, logits) == want);
    CHECK(first_token(opts(1.3, 1, 0.95, seed), logits) == want);
    CHECK(first_token(opts(0.7, 1, 1.0, seed + 100), logits) == want);
  }
}

TEST_CASE("the same seed draws the same tokens, another seed others") {
  const auto logits = random_logits(99, 500);
  auto draw = [&](uint64_t seed) {
    TokenSampler s(opts(1.5, 0, 1.0, seed));
    std::vector<int64_t> out;
    for (int i = 0; i < 32; ++i) out.push_back(next(s, opts(1.5, 0, 1.0, seed), logits));
    return out;
  };
  CHECK(draw(5) == draw(5));
  CHECK(draw(5) != draw(6));
}

TEST_CASE("sampling options out of range are rejected naming the flag") {
  CHECK_THROWS_WITH(TokenSampler(opts(0.0, 0, 1.0)), Catch::Contains("--temperature"));
  CHECK_THROWS_WITH(TokenSampler(opts(-1.0, 0, 1.0)), Catch::Contains("--temperature"));
  CHECK_THROWS_WITH(TokenSampler(opts(1.0, -1, 1.0)), Catch::Contains("--top-k"));
  CHECK_THROWS_WITH(TokenSampler(opts(1.0, 0, 0.0)), Catch::Contains("--top-p"));
  CHECK_THROWS_WITH(TokenSampler(opts(1.0, 0, 1.5)), Catch::Contains("--top-p"));
  SamplingOptions greedy;
  greedy.greedy = true;
  greedy.temperature = 0.0;  // ignored with --greedy
  CHECK_NOTHROW(TokenSampler(greedy));
  SampleRow r;
  r.uniform = 0.5;
  CHECK_THAT(loom::generate::sample_rows(row_of({1.0f, std::nanf("")}), {r}).errors[0],
             Catch::Contains("logit of token 1 is"));
  CHECK_THROWS_AS(loom::generate::sample_rows(at::zeros({1, 0}), {r}), std::invalid_argument);  // host: test input
}
