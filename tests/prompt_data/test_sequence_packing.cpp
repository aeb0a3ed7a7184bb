// Packed sequences: first-fit decreasing against a plain scan of the rows on random lengths and
// a worked case; packed rows against each example's own unpacked row; errors.
#include <catch2/catch.hpp>

#include <random>

#include "prompt_data/sequence_packing.h"
#include "prompt_test_util.h"

using namespace loom;
using namespace loom::prompt_data;
using namespace loom::prompt_data::test;
using Ids = std::vector<int64_t>;

namespace {

// First-fit decreasing written the obvious way: every row scanned in order.
std::vector<Ids> scanned_ffd(const Ids& lengths, int64_t capacity) {
  Ids order(lengths.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
  std::vector<Ids> packs;
  Ids free;
  for (const int64_t i : order) {
    size_t row = 0;
    while (row < packs.size() && free[row] < lengths[i]) ++row;
    if (row == packs.size()) {
      packs.emplace_back();
      free.push_back(capacity);
    }
    packs[row].push_back(i);
    free[row] -= lengths[i];
  }
  return packs;
}

}  // namespace

TEST_CASE("first-fit decreasing places the longest first, each into the first row with room") {
  const SequencePacking p = first_fit_decreasing({3, 7, 5, 2, 4, 1}, 8);
  CHECK(p.packs == std::vector<Ids>{{1, 5}, {2, 0}, {4, 3}});
  CHECK(p.filled == 22);
  CHECK(p.efficiency() == Approx(22.0 / 24.0));
  CHECK(first_fit_decreasing({}, 8).efficiency() == 0.0);
}

TEST_CASE("first-fit decreasing equals a scan of every row on random lengths") {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t capacity = std::uniform_int_distribution<int64_t>(1, 64)(rng);
    Ids lengths(std::uniform_int_distribution<size_t>(0, 300)(rng));
    for (auto& n : lengths) n = std::uniform_int_distribution<int64_t>(1, capacity)(rng);
    const SequencePacking p = first_fit_decreasing(lengths, capacity);
    REQUIRE(p.packs == scanned_ffd(lengths, capacity));
    CHECK(p.filled == std::accumulate(lengths.begin(), lengths.end(), int64_t{0}));
  }
}

TEST_CASE("first-fit decreasing refuses what no row can hold, naming the example") {
  CHECK_THROWS_WITH(first_fit_decreasing({3, 9}, 8), "example 1 has 9 input positions; a packed row holds 1 to 8");
  CHECK_THROWS_WITH(first_fit_decreasing({0}, 8), "example 0 has 0 input positions; a packed row holds 1 to 8");
  CHECK_THROWS_WITH(first_fit_decreasing({1}, 0), "packing capacity must be >= 1, found 0");
}

TEST_CASE("a packed row holds each example's own row, positions restarting, then padding") {
  const auto templates = parse_task_templates(
      {task("qa", "Question: {question} Answer: {answer}", {"question", "answer"}, {}, "answer", true, "question")}, 64);
  ExampleOptions o;
  o.max_seq_length = 64;
  std::vector<PromptExample> owned;
  for (const auto& [q, a] : std::vector<std::pair<std::string, std::string>>{
           {"Who wrote Hamlet?", "Shakespeare"}, {"Sum of two and two?", "four"}, {"Capital of France?", "Paris"}})
    owned.push_back(*make_prompt_example({{"question", q}, {"answer", a}}, 0, templates[0], gpt2(), o));
  std::vector<const PromptExample*> examples;
  for (const auto& e : owned) examples.push_back(&e);
  const int64_t capacity = owned[0].size() - 1 + owned[2].size() - 1 + 3;  // room for two and some padding

  const PackedRows rows = make_packed_rows(examples, {{2, 0}, {1}}, capacity, templates, kEod);
  REQUIRE(rows.rows == 2);
  CHECK(rows.segment_starts[0] == Ids{0, owned[2].size() - 1, owned[2].size() + owned[0].size() - 2});
  CHECK(rows.segment_starts[1] == Ids{0, owned[1].size() - 1});
  for (int64_t r = 0; r < rows.rows; ++r) {
    const Ids& starts = rows.segment_starts[static_cast<size_t>(r)];
    const Ids pack = r == 0 ? Ids{2, 0} : Ids{1};
    for (size_t k = 0; k < pack.size(); ++k) {
      const int64_t n = starts[k + 1] - starts[k];
      // Directly: the example's first token opens its segment and its last token is the last
      // label, so nothing crosses into the next example.
      const PromptExample& e = *examples[static_cast<size_t>(pack[k])];
      CHECK(n == e.size() - 1);
      CHECK(rows.tokens[static_cast<size_t>(r * capacity + starts[k])] == e.tokens.front());
      CHECK(rows.labels[static_cast<size_t>(r * capacity + starts[k + 1] - 1)] == e.tokens.back());
      const PromptBatch own = make_prompt_batch({examples[static_cast<size_t>(pack[k])]}, templates, n, kEod);
      for (int64_t j = 0; j < n; ++j) {
        const size_t at = static_cast<size_t>(r * capacity + starts[k] + j);
        CHECK(rows.tokens[at] == own.tokens[static_cast<size_t>(j)]);
        CHECK(rows.labels[at] == own.labels[static_cast<size_t>(j)]);
        CHECK(rows.loss_mask[at] == own.loss_mask[static_cast<size_t>(j)]);
        CHECK(rows.position_ids[at] == j);
      }
    }
    // Only the answers count; padding counts nothing and holds pad ids at position 0.
    for (int64_t j = starts.back(); j < capacity; ++j) {
      const size_t at = static_cast<size_t>(r * capacity + j);
      CHECK((rows.tokens[at] == kEod && rows.labels[at] == kEod && rows.loss_mask[at] == 0.0f &&
             rows.position_ids[at] == 0));
    }
  }
  CHECK(std::accumulate(rows.loss_mask.begin(), rows.loss_mask.end(), 0.0f) ==
        static_cast<float>(owned[0].answer_length + owned[1].answer_length + owned[2].answer_length));

  CHECK_THROWS_WITH(make_packed_rows(examples, {{0, 1, 2}}, capacity, templates, kEod),
                    "packed row 0's examples need more than its " + std::to_string(capacity) + " positions");
  CHECK_THROWS_WITH(make_packed_rows(examples, {{3}}, capacity, templates, kEod), "packed row 0 names example 3 of 3");
}
