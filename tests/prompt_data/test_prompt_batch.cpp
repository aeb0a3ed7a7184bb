// Batch rows: exact tokens, labels, loss masks, virtual and answer masks of a small multi-task
// batch, answer-only or not; errors.
#include <catch2/catch.hpp>

#include "prompt_data/prompt_batch.h"
#include "prompt_test_util.h"

using namespace loom;
using namespace loom::prompt_data;
using namespace loom::prompt_data::test;
using Ids = std::vector<int64_t>;
using Flags = std::vector<uint8_t>;
using Floats = std::vector<float>;

namespace {

constexpr int64_t E = kEod;

std::vector<ParsedTemplate> templates(bool speaker_answer_only) {
  return parse_task_templates(
      {task("sentiment", "<|VIRTUAL_PROMPT_0|> Review: {review} Sentiment: {label}", {"review", "label"}, {2}, "label",
            true, "review"),
       task("speaker", "<|VIRTUAL_PROMPT_0|><|VIRTUAL_PROMPT_1|> Line: {text} Speaker: {name}", {"text", "name"},
            {1, 2}, "name", speaker_answer_only)},
      32);
}

PromptExample example(const PromptRecord& r, int64_t task_index, const std::vector<ParsedTemplate>& ts) {
  ExampleOptions o;
  o.max_seq_length = 32;
  auto ex = make_prompt_example(r, task_index, ts[static_cast<size_t>(task_index)], gpt2(), o);
  REQUIRE(ex);
  return *ex;
}

template <class T>
std::vector<T> row(const std::vector<T>& flat, int64_t r, int64_t s) {
  return std::vector<T>(flat.begin() + r * s, flat.begin() + (r + 1) * s);
}

}  // namespace

TEST_CASE("a multi-task batch: tokens, labels and masks", "[batch]") {
  for (const bool speaker_answer_only : {false, true}) {
    INFO("speaker answer_only_loss " << speaker_answer_only);
    const auto ts = templates(speaker_answer_only);
    const auto a = example({{"review", "great movie"}, {"label", "positive"}}, 0, ts);
    const auto b = example({{"text", "Hello world"}, {"name", "Nurse"}}, 1, ts);
    const auto c = example({{"review", "bad"}, {"label", "positive"}}, 0, ts);
    REQUIRE(a.tokens == Ids{E, E, 6602, 25, 1049, 3807, 11352, 3681, 25, 3967, E});
    REQUIRE(b.tokens == Ids{E, E, E, 6910, 25, 18435, 995, 14931, 25, 42724, E});
    REQUIRE(c.tokens == Ids{E, E, 6602, 25, 2089, 11352, 3681, 25, 3967, E});

    const int64_t s = 12;
    const auto batch = make_prompt_batch({&a, &b, &c}, ts, s, /*pad_id=*/0);
    CHECK(batch.batch == 3);
    CHECK(batch.seq_length == s);
    CHECK(batch.task == Ids{0, 1, 0});
    CHECK(batch.tokens.size() == 36);

    CHECK(row(batch.tokens, 0, s) == Ids{E, E, 6602, 25, 1049, 3807, 11352, 3681, 25, 3967, 0, 0});
    CHECK(row(batch.labels, 0, s) == Ids{E, 6602, 25, 1049, 3807, 11352, 3681, 25, 3967, E, 0, 0});
    CHECK(row(batch.virtual_mask, 0, s) == Flags{1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
    CHECK(row(batch.answer_mask, 0, s) == Flags{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0});
    CHECK(row(batch.loss_mask, 0, s) == Floats{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0});  // answer only

    CHECK(row(batch.tokens, 1, s) == Ids{E, E, E, 6910, 25, 18435, 995, 14931, 25, 42724, 0, 0});
    CHECK(row(batch.labels, 1, s) == Ids{E, E, 6910, 25, 18435, 995, 14931, 25, 42724, E, 0, 0});
    CHECK(row(batch.virtual_mask, 1, s) == Flags{1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0});
    CHECK(row(batch.answer_mask, 1, s) == Flags{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0});
    if (speaker_answer_only) {
      CHECK(row(batch.loss_mask, 1, s) == Floats{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0});
    } else {
      // Every label but the virtual ones (labels 0 and 1 are virtual positions 1 and 2).
      CHECK(row(batch.loss_mask, 1, s) == Floats{0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0});
    }

    CHECK(row(batch.tokens, 2, s) == Ids{E, E, 6602, 25, 2089, 11352, 3681, 25, 3967, 0, 0, 0});
    CHECK(row(batch.labels, 2, s) == Ids{E, 6602, 25, 2089, 11352, 3681, 25, 3967, E, 0, 0, 0});
    CHECK(row(batch.virtual_mask, 2, s) == Flags{1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
    CHECK(row(batch.answer_mask, 2, s) == Flags{0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0});
    CHECK(row(batch.loss_mask, 2, s) == Floats{0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0});
  }
}

TEST_CASE("rows at the exact length, without EOS, and errors", "[batch]") {
  const auto ts = templates(false);
  const auto b = example({{"text", "Hello world"}, {"name", "Nurse"}}, 1, ts);
  SECTION("an example of s + 1 tokens fills its row") {
    const auto batch = make_prompt_batch({&b}, ts, 10, 0);
    CHECK(batch.tokens == Ids{E, E, E, 6910, 25, 18435, 995, 14931, 25, 42724});
    CHECK(batch.labels == Ids{E, E, 6910, 25, 18435, 995, 14931, 25, 42724, E});
    CHECK(batch.loss_mask == Floats{0, 0, 1, 1, 1, 1, 1, 1, 1, 1});
  }
  SECTION("without EOS the answer mask covers the answer alone") {
    ExampleOptions o;
    o.max_seq_length = 32;
    o.add_eos = false;
    const auto ex = *make_prompt_example({{"text", "Hello world"}, {"name", "Nurse"}}, 1, ts[1], gpt2(), o);
    const auto batch = make_prompt_batch({&ex}, ts, 10, 0);
    CHECK(batch.labels == Ids{E, E, 6910, 25, 18435, 995, 14931, 25, 42724, 0});
    CHECK(batch.answer_mask == Flags{0, 0, 0, 0, 0, 0, 0, 0, 1, 0});
    CHECK(batch.loss_mask == Floats{0, 0, 1, 1, 1, 1, 1, 1, 1, 0});
  }
  SECTION("errors") {
    CHECK_THROWS_WITH(make_prompt_batch({&b}, ts, 9, 0),
                      "prompt batch: row 0 has 11 tokens; sequence length 9 holds at most 10");
    CHECK_THROWS_AS(make_prompt_batch({&b}, ts, 0, 0), std::invalid_argument);
    PromptExample bad = b;
    bad.task = 2;
    CHECK_THROWS_WITH(make_prompt_batch({&bad}, ts, 12, 0), "prompt batch: row 0 has task index 2 of 2 tasks");
    ExampleOptions o;
    o.max_seq_length = 32;
    o.for_inference = true;
    const auto inf = *make_prompt_example({{"text", "Hello world"}}, 1, ts[1], gpt2(), o);
    CHECK_THROWS_WITH(make_prompt_batch({&b, &inf}, ts, 12, 0), "prompt batch: row 1 is an inference example");
  }
  SECTION("an empty batch") {
    const auto batch = make_prompt_batch(std::vector<const PromptExample*>{}, ts, 8, 0);
    CHECK(batch.batch == 0);
    CHECK(batch.tokens.empty());
  }
}

TEST_CASE("rows from a dataset by index", "[batch]") {
  TempDir dir;
  const auto f = dir.write("train.jsonl",
                           "{\"taskname\": \"sentiment\", \"review\": \"great movie\", \"label\": \"positive\"}\n"
                           "{\"taskname\": \"speaker\", \"text\": \"Hello world\", \"name\": \"Nurse\"}\n");
  ExampleOptions o;
  o.max_seq_length = 32;
  const PromptDataset ds({f}, templates(false), gpt2(), o);
  const int64_t s = run_sequence_length({&ds});
  CHECK(s == 16);
  const auto batch = make_prompt_batch(ds, {1, 0, 1}, s);
  CHECK(batch.task == Ids{1, 0, 1});
  CHECK(row(batch.tokens, 0, s) == Ids{E, E, E, 6910, 25, 18435, 995, 14931, 25, 42724, E, E, E, E, E, E});
  CHECK(row(batch.labels, 1, s) == Ids{E, 6602, 25, 1049, 3807, 11352, 3681, 25, 3967, E, E, E, E, E, E, E});
  CHECK(row(batch.loss_mask, 1, s) == Floats{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0});
  CHECK(row(batch.loss_mask, 2, s) == Floats{0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0});
  CHECK_THROWS_AS(make_prompt_batch(ds, {2}, s), std::out_of_range);
  CHECK_THROWS_AS(make_prompt_batch(ds, {-1}, s), std::out_of_range);
}
