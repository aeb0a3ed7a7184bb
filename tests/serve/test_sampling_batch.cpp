// The batched sampler (generate/sampling_batch.h) against an independent host reference of
// the documented rules (generate/sampling_reference.h): rows of every kind (greedy,
// temperature, top-k, top-p, both, repetition penalty, a banned stop token, tied logits) drawn
// for many steps with the same uniforms give the same tokens and distributions; the
// log-probabilities and the alternatives are the raw logits' log-softmax; a row with a NaN
// logit fails alone.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <cmath>
#include <random>

#include "generate/sampling.h"
#include "generate/sampling_batch.h"
#include "generate/sampling_reference.h"

using namespace loom::generate;
using namespace loom::generate::test;

namespace {

SamplingOptions options_of(int kind, uint64_t seed) {
  SamplingOptions o;
  o.seed = seed;
  switch (kind % 8) {
    case 0: o.greedy = true; break;
    case 1: o.temperature = 0.7; break;
    case 2: o.top_k = 5; o.temperature = 1.3; break;
    case 3: o.top_p = 0.6; break;
    case 4: o.top_k = 20; o.top_p = 0.9; o.temperature = 0.9; break;
    case 5: o.repetition_penalty = 1.4; o.temperature = 1.1; break;
    case 6: o.greedy = true; o.repetition_penalty = 2.0; break;
    default: o.top_k = 1; break;
  }
  return o;
}

}  // namespace

TEST_CASE("Batched sampling chooses the reference's tokens for the same uniforms") {
  const int64_t rows = 16, vocab = 60, steps = 200;
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<TokenSampler> batched;
  std::vector<SamplingOptions> opts;
  std::vector<std::vector<int64_t>> context(rows);
  for (int64_t i = 0; i < rows; ++i) {
    opts.push_back(options_of(static_cast<int>(i), 100 + static_cast<uint64_t>(i)));
    batched.emplace_back(opts.back());
    context[static_cast<size_t>(i)] = {static_cast<int64_t>(i) % vocab, 3, 7};
  }
  for (int64_t step = 0; step < steps; ++step) {
    at::Tensor logits = at::empty({rows, vocab}, at::kFloat);  // host: test input
    float* z = logits.data_ptr<float>();
    for (int64_t k = 0; k < rows * vocab; ++k) {
      z[k] = normal(gen);
      if (k % 7 == 0) z[k] = std::round(z[k]);  // ties among the most probable tokens too
    }
    std::vector<SampleRow> batch;
    for (int64_t i = 0; i < rows; ++i) {
      SampleRow r;
      r.options = opts[static_cast<size_t>(i)];
      r.penalized = &context[static_cast<size_t>(i)];
      r.banned_token = step < 5 && i % 3 == 0 ? 2 : -1;  // min tokens: the stop token held back
      r.uniform = r.options.greedy ? 0.0 : batched[static_cast<size_t>(i)].draw_uniform();
      r.top_logprobs = i % 4;
      r.logprob = i % 3 != 2;  // rows 8, 20, ...: neither a log-probability nor alternatives asked
      batch.push_back(r);
    }
    const SampledRows got = sample_rows(logits, batch);
    const at::Tensor distributions = sampling_probabilities(logits, batch);
    for (int64_t i = 0; i < rows; ++i) {
      INFO("row " << i << ", step " << step);
      std::vector<float> row(z + i * vocab, z + (i + 1) * vocab);
      const SampleRow& r = batch[static_cast<size_t>(i)];
      const int64_t want = reference_token(row, r.options, r.uniform, context[static_cast<size_t>(i)], r.banned_token);
      REQUIRE(got.errors[static_cast<size_t>(i)].empty());
      REQUIRE(got.tokens[static_cast<size_t>(i)] == want);
      if (step % 20 == 0) {
        const auto d = reference_distribution(row, r.options, context[static_cast<size_t>(i)], r.banned_token);
        for (int64_t v = 0; v < vocab; ++v) REQUIRE(std::abs(distributions[i][v].item<double>() - d[v]) < 1e-12);
      }
      // Log-probabilities of the raw logits, in double.
      double mx = -INFINITY, sum = 0;
      for (int64_t v = 0; v < vocab; ++v) mx = std::max(mx, static_cast<double>(z[i * vocab + v]));
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(z[i * vocab + v]) - mx);
      const double lse = mx + std::log(sum);
      if (r.logprob || r.top_logprobs > 0)
        REQUIRE(std::abs(got.logprobs[static_cast<size_t>(i)] - (z[i * vocab + want] - lse)) < 1e-12);
      else
        REQUIRE(std::isnan(got.logprobs[static_cast<size_t>(i)]));
      const auto& top = got.top[static_cast<size_t>(i)];
      REQUIRE(static_cast<int64_t>(top.size()) == i % 4);
      for (size_t j = 0; j < top.size(); ++j) {
        if (j > 0) {
          const float a = z[i * vocab + top[j - 1].first], b = z[i * vocab + top[j].first];
          REQUIRE((a > b || (a == b && top[j - 1].first < top[j].first)));
        }
        REQUIRE(std::abs(top[j].second - (z[i * vocab + top[j].first] - lse)) < 1e-12);
      }
      context[static_cast<size_t>(i)].push_back(want);
    }
  }
}

TEST_CASE("Batched sampling: a row with a NaN logit fails alone, bad shapes and options are refused") {
  at::Tensor logits = at::randn({3, 10});  // host: test input
  logits[1][4] = std::nan("");
  std::vector<SampleRow> batch(3);
  batch[0].options.greedy = true;
  batch[1].options.greedy = true;
  batch[2].options.temperature = 0.5;
  batch[2].uniform = 0.3;
  const SampledRows got = sample_rows(logits, batch);
  REQUIRE(got.tokens[1] == -1);
  REQUIRE_THAT(got.errors[1], Catch::Contains("logit of token 4 is"));
  REQUIRE(got.errors[0].empty());
  REQUIRE(got.tokens[0] == logits[0].argmax().item<int64_t>());
  REQUIRE(got.errors[2].empty());
  REQUIRE_THROWS_WITH(sample_rows(logits, std::vector<SampleRow>(2)), Catch::Contains("expected logits [2"));
  batch[2].options.top_p = 0;
  REQUIRE_THROWS_WITH(sample_rows(logits, batch), Catch::Contains("--top-p"));
}
