// Speculative decoding's parts (serve/speculative.h, generate/sampling_batch.h): prompt-lookup
// drafts; the verification rule against exact distributions (a point-mass draft is accepted
// with probability p(x) and the output is distributed as p; with a draft distribution q the
// first output token is distributed as p, which always accepting the draft, whose output is
// q, fails by far); greedy rows accept while the argmax is the draft; bad options name their
// flag. The engine's speculation is tested in test_engine.cpp.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <cmath>
#include <random>

#include "generate/sampling_batch.h"
#include "generate/sampling_reference.h"
#include "serve/kv_block_pool.h"
#include "serve/speculative.h"

using namespace loom;
using generate::SampleRow;

namespace {

double total_variation(const std::vector<double>& a, const std::vector<double>& b) {
  double tv = 0;
  for (size_t i = 0; i < a.size(); ++i) tv += std::abs(a[i] - b[i]);
  return tv / 2;
}

const std::vector<float> kLogits = {1.5f, 0.2f, -0.7f, 2.1f, 0.9f, -2.0f, 0.0f, 1.1f};
const std::vector<float> kDraftLogits = {-0.5f, 1.8f, 0.4f, 0.3f, 2.2f, 0.1f, -1.0f, 0.6f};

SampleRow sampled_row(double temperature, int64_t top_k, double top_p) {
  SampleRow r;
  r.options.temperature = temperature;
  r.options.top_k = top_k;
  r.options.top_p = top_p;
  return r;
}

// rows × V logits, every row `z`.
at::Tensor repeat_rows(const std::vector<float>& z, int64_t rows) {
  return at::tensor(z).view({1, static_cast<int64_t>(z.size())}).repeat({rows, 1});  // host: test input
}

}  // namespace

TEST_CASE("Prompt lookup drafts what followed the latest earlier occurrence of the longest n-gram") {
  using serve::propose_ngram_draft;
  // "1 2 3 9 1 2 3" ends with 1 2 3, which occurred at 0: 9 followed, then 1 2 ...
  CHECK(propose_ngram_draft({1, 2, 3, 9, 1, 2, 3}, 1, 3, 3) == std::vector<int64_t>{9, 1, 2});
  // The longest match wins over a later shorter one: "5 3" occurs at 0 (followed by 7), "3" at 4 (by 8).
  CHECK(propose_ngram_draft({5, 3, 7, 0, 3, 8, 5, 3}, 1, 2, 2) == std::vector<int64_t>{7, 0});
  // min_n 2: a lone repeated token does not count.
  CHECK(propose_ngram_draft({4, 6, 1, 6}, 2, 3, 2).empty());
  CHECK(propose_ngram_draft({4, 6, 1, 6}, 1, 3, 2) == std::vector<int64_t>{1, 6});
  // The latest occurrence of a period-2 run, continued past the context's end by the draft itself.
  CHECK(propose_ngram_draft({8, 1, 2, 1, 2}, 2, 2, 5) == std::vector<int64_t>{1, 2, 1, 2, 1});
  CHECK(propose_ngram_draft({7, 7, 7}, 1, 4, 3) == std::vector<int64_t>{7, 7, 7});
  CHECK(propose_ngram_draft({1, 2, 3}, 1, 3, 4).empty());
  CHECK(propose_ngram_draft({}, 1, 3, 4).empty());
  CHECK(propose_ngram_draft({1, 1}, 1, 3, 0).empty());
}

TEST_CASE("Speculative options and methods out of range are refused naming the flag") {
  serve::SpeculativeOptions o;
  CHECK_NOTHROW(serve::validate(o));
  o.num_tokens = 0;
  CHECK_THROWS_WITH(serve::validate(o), Catch::Contains("--num-speculative-tokens"));
  o = {};
  o.prompt_lookup_min = 0;
  CHECK_THROWS_WITH(serve::validate(o), Catch::Contains("--prompt-lookup-min"));
  o = {};
  o.prompt_lookup_max = 1;
  CHECK_THROWS_WITH(serve::validate(o), Catch::Contains("--prompt-lookup-max"));
  CHECK(serve::parse_speculative_method("ngram") == serve::SpeculativeMethod::kNgram);
  CHECK(serve::parse_speculative_method("none") == serve::SpeculativeMethod::kNone);
  CHECK_THROWS_WITH(serve::parse_speculative_method("medusa"), Catch::Contains("--speculative-method"));
  CHECK(serve::parse_speculative_method("draft") == serve::SpeculativeMethod::kDraft);
}

TEST_CASE("A point-mass draft is accepted with probability p(x) and the output follows p") {
  // A grid of N uniforms stands for the uniform distribution: every frequency below is exact
  // up to 1/N per boundary crossed.
  const int64_t n = 4000, vocab = static_cast<int64_t>(kLogits.size());
  for (const SampleRow& base : {sampled_row(1.0, 0, 1.0), sampled_row(0.7, 5, 0.9)}) {
    const auto p = generate::test::reference_distribution(kLogits, base.options);
    for (int64_t x : {int64_t{3}, int64_t{4}, int64_t{5}}) {
      INFO("draft " << x << ", temperature " << base.options.temperature);
      std::vector<SampleRow> rows(static_cast<size_t>(n), base);
      for (int64_t i = 0; i < n; ++i) {
        rows[static_cast<size_t>(i)].uniform = (static_cast<double>(i) + 0.5) / static_cast<double>(n);
        rows[static_cast<size_t>(i)].draft_token = x;
      }
      const auto got = generate::sample_rows(repeat_rows(kLogits, n), rows);
      std::vector<double> freq(static_cast<size_t>(vocab), 0.0);
      double accepted = 0;
      for (int64_t i = 0; i < n; ++i) {
        freq[static_cast<size_t>(got.tokens[static_cast<size_t>(i)])] += 1.0 / static_cast<double>(n);
        if (got.accepted[static_cast<size_t>(i)]) {
          accepted += 1.0 / static_cast<double>(n);
          REQUIRE(got.tokens[static_cast<size_t>(i)] == x);
        }
      }
      CHECK(std::abs(accepted - p[static_cast<size_t>(x)]) <= 2.0 / static_cast<double>(n));
      CHECK(total_variation(freq, p) <= static_cast<double>(vocab) / static_cast<double>(n));
    }
  }
}

TEST_CASE("Rejection sampling with a draft distribution outputs the target distribution") {
  // The first output token of one verified draft position: x ~ q (every x, weighted by q(x)
  // exactly), the acceptance test and the residual draw over an N × N grid of uniforms.
  const int64_t n = 160, vocab = static_cast<int64_t>(kLogits.size());
  for (const SampleRow& base : {sampled_row(1.0, 0, 1.0), sampled_row(1.3, 6, 0.95)}) {
    INFO("temperature " << base.options.temperature << ", top-k " << base.options.top_k);
    const auto p = generate::test::reference_distribution(kLogits, base.options);
    // The draft model's distribution under the same options (its own logits).
    const auto q = generate::test::reference_distribution(kDraftLogits, base.options);
    std::vector<SampleRow> rows;
    std::vector<double> weight;
    for (int64_t x = 0; x < vocab; ++x) {
      if (q[static_cast<size_t>(x)] == 0) continue;
      for (int64_t a = 0; a < n; ++a)
        for (int64_t u = 0; u < n; ++u) {
          SampleRow r = base;
          r.draft_token = x;
          r.accept_uniform = (static_cast<double>(a) + 0.5) / static_cast<double>(n);
          r.uniform = (static_cast<double>(u) + 0.5) / static_cast<double>(n);
          rows.push_back(r);
          weight.push_back(q[static_cast<size_t>(x)] / static_cast<double>(n * n));
        }
    }
    const int64_t m = static_cast<int64_t>(rows.size());
    at::Tensor q_rows = at::tensor(q, at::kDouble).view({1, vocab}).repeat({m, 1});  // host: test input
    const auto got = generate::sample_rows(repeat_rows(kLogits, m), rows, q_rows);
    std::vector<double> out(static_cast<size_t>(vocab), 0.0);
    double accepted = 0;
    for (int64_t i = 0; i < m; ++i) {
      out[static_cast<size_t>(got.tokens[static_cast<size_t>(i)])] += weight[static_cast<size_t>(i)];
      if (got.accepted[static_cast<size_t>(i)]) {
        accepted += weight[static_cast<size_t>(i)];
        REQUIRE(got.tokens[static_cast<size_t>(i)] == rows[static_cast<size_t>(i)].draft_token);
      }
    }
    // Acceptance rate sum_x min(p(x), q(x)) = 1 - TV(p, q) (Leviathan et al., Theorem 3.5).
    const double tv_pq = total_variation(p, q);
    CHECK(std::abs(accepted - (1 - tv_pq)) <= 2.0 / static_cast<double>(n));
    // The output follows p within the grid's resolution; always accepting would output q, far
    // beyond that bound (the threshold can fail).
    const double bound = static_cast<double>(vocab) / static_cast<double>(n);
    CHECK(total_variation(out, p) <= bound);
    REQUIRE(tv_pq > 3 * bound);
  }
}

TEST_CASE("Greedy rows accept while the argmax is the draft, a draft equal to the target always") {
  SampleRow r;
  r.options.greedy = true;
  const int64_t best = 3;  // argmax of kLogits
  std::vector<SampleRow> rows;
  for (int64_t x = 0; x < static_cast<int64_t>(kLogits.size()); ++x) {
    r.draft_token = x;
    rows.push_back(r);
  }
  r.draft_token = -1;
  rows.push_back(r);  // no draft: never accepted
  const int64_t m = static_cast<int64_t>(rows.size());
  for (bool with_q : {false, true}) {
    // q: the target's own distribution (a draft equal to the target).
    const at::Tensor q = with_q ? generate::sampling_probabilities(repeat_rows(kLogits, m), rows) : at::Tensor();
    const auto got = generate::sample_rows(repeat_rows(kLogits, m), rows, q);
    for (int64_t i = 0; i < m; ++i) {
      INFO("row " << i << ", q " << with_q);
      CHECK(got.tokens[static_cast<size_t>(i)] == best);
      CHECK(got.accepted[static_cast<size_t>(i)] == (i == best));
    }
  }
  // Sampled rows with q = p accept every draft.
  std::vector<SampleRow> same(64, sampled_row(0.9, 0, 1.0));
  std::mt19937_64 gen(3);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const at::Tensor q = generate::sampling_probabilities(repeat_rows(kLogits, 64), same);
  for (size_t i = 0; i < same.size(); ++i) {
    same[i].draft_token = static_cast<int64_t>(i % kLogits.size());
    same[i].accept_uniform = uniform(gen);
    same[i].uniform = uniform(gen);
  }
  const auto got = generate::sample_rows(repeat_rows(kLogits, 64), same, q);
  for (size_t i = 0; i < same.size(); ++i) CHECK(got.accepted[i]);
  CHECK_THROWS_WITH(generate::sample_rows(repeat_rows(kLogits, 64), same, q.narrow(0, 0, 3)),
                    Catch::Contains("draft probabilities"));
}

TEST_CASE("Rolling back drafts frees the blocks past the kept positions, never a committed one") {
  serve::KvBlockPool pool(8, 4);
  serve::RequestBlocks table;
  const std::vector<int64_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  REQUIRE(pool.grow(table, 14));  // 4 blocks: a token at position 9 and 4 drafted positions after it
  pool.commit(table, tokens, 9, -1);  // positions 0..8 computed: blocks 0 and 1 full
  REQUIRE(table.committed == 2);
  const auto blocks = table.blocks;
  pool.truncate(table, 10);  // the accepted positions 0..9: 3 blocks
  REQUIRE(table.blocks == std::vector<int64_t>(blocks.begin(), blocks.begin() + 3));
  REQUIRE(pool.num_free() == 5);
  REQUIRE(pool.ref_count(blocks[3]) == 0);
  pool.truncate(table, 1);  // never below the committed blocks
  REQUIRE(table.blocks.size() == 2);
  REQUIRE(pool.num_free() == 6);
  pool.release(table);
  REQUIRE(pool.num_free() == 8);
}
