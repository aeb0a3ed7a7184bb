// Records -> token ids: exact ids (piecewise == whole-string tokenisation at word boundaries),
// virtual positions, answer spans, BOS/EOS, truncation, dropped records, inference examples.
#include <catch2/catch.hpp>

#include <algorithm>

#include "prompt_data/prompt_example.h"
#include "prompt_test_util.h"

using namespace loom;
using namespace loom::prompt_data;
using namespace loom::prompt_data::test;
using Ids = std::vector<int64_t>;
using Flags = std::vector<uint8_t>;

namespace {

ExampleOptions options(int64_t max_seq_length = 64) {
  ExampleOptions o;
  o.max_seq_length = max_seq_length;
  return o;
}

PromptExample make(const PromptRecord& r, const ParsedTemplate& t, const ExampleOptions& o, int64_t task = 0) {
  auto ex = make_prompt_example(r, task, t, gpt2(), o);
  REQUIRE(ex);
  return *ex;
}

Flags flags(std::initializer_list<std::pair<uint8_t, int64_t>> runs) {
  Flags out;
  for (const auto& [v, n] : runs) out.insert(out.end(), static_cast<size_t>(n), v);
  return out;
}

}  // namespace

TEST_CASE("a record becomes the ids of its pieces, virtual tokens in place", "[example]") {
  const auto t = parse_task_template(task("speaker", "Line: {text}<|VIRTUAL_PROMPT_0|><|VIRTUAL_PROMPT_1|> Speaker: {label}",
                                          {"text", "label"}, {3, 2}, "label", true),
                                     64);
  const PromptRecord r{{"text", "I am here"}, {"label", "Romeo"}};

  // The pieces meet at word boundaries, so they give the ids of the natural strings.
  CHECK(ids("Line: I am here") == Ids{13949, 25, 314, 716, 994});
  CHECK(ids(" Speaker: Romeo") == Ids{14931, 25, 43989});
  CHECK(cat({ids("Line:"), ids(" I am here")}) == ids("Line: I am here"));
  CHECK(cat({ids(" Speaker:"), ids(" Romeo")}) == ids(" Speaker: Romeo"));
  // Without the template's space the answer would be other ids ("Romeo" is R ome o).
  CHECK(ids("Romeo") == Ids{49, 462, 78});

  SECTION("add_eos (default)") {
    const auto ex = make(r, t, options(), 3);
    CHECK(ex.task == 3);
    CHECK(ex.tokens == Ids{13949, 25, 314, 716, 994, kEod, kEod, kEod, kEod, kEod, 14931, 25, 43989, kEod});
    CHECK(ex.is_virtual == flags({{0, 5}, {1, 5}, {0, 4}}));
    CHECK(ex.answer_start == 12);
    CHECK(ex.answer_length == 2);  // " Romeo" and the EOS
    CHECK(ex.prompt_length == 12);
    CHECK(ex.answer_tokens == Ids{43989});
    CHECK(!ex.inference);
    CHECK(ex.truncated == 0);
  }
  SECTION("without EOS") {
    auto o = options();
    o.add_eos = false;
    const auto ex = make(r, t, o);
    CHECK(ex.tokens == Ids{13949, 25, 314, 716, 994, kEod, kEod, kEod, kEod, kEod, 14931, 25, 43989});
    CHECK(ex.answer_start == 12);
    CHECK(ex.answer_length == 1);
  }
  SECTION("with BOS, and another pad id at the virtual positions") {
    auto o = options();
    o.add_bos = true;
    o.pad_id = 7;
    const auto ex = make(r, t, o);
    CHECK(ex.tokens == Ids{kEod, 13949, 25, 314, 716, 994, 7, 7, 7, 7, 7, 14931, 25, 43989, kEod});
    CHECK(ex.is_virtual == flags({{0, 6}, {1, 5}, {0, 4}}));
    CHECK(ex.answer_start == 13);
    CHECK(ex.answer_length == 2);
  }
}

TEST_CASE("markers at the start, middle and end are laid out in order", "[example]") {
  const auto t = parse_task_template(
      task("qa", "<|VIRTUAL_PROMPT_0|>Question: {question}<|VIRTUAL_PROMPT_1|> Answer: {answer}", {"question", "answer"},
           {2, 3}, "answer"),
      64);
  const auto ex = make({{"question", "What is the capital of France?"}, {"answer", "Paris"}}, t, options());
  const Ids question = ids("Question: What is the capital of France?");
  CHECK(question == cat({ids("Question:"), ids(" What is the capital of France?")}));
  CHECK(ex.tokens == cat({repeat(kEod, 2), question, repeat(kEod, 3), ids(" Answer:"), Ids{6342}, Ids{kEod}}));
  CHECK(ex.is_virtual == flags({{1, 2}, {0, static_cast<int64_t>(question.size())}, {1, 3}, {0, 4}}));
  CHECK(ex.answer_start == ex.size() - 2);

  // A marker at the very end (a task without answer).
  const auto t2 = parse_task_template(task("lm", "{text}<|VIRTUAL_PROMPT_0|>", {"text"}, {2}), 64);
  const auto ex2 = make({{"text", "Hello world"}}, t2, options());
  CHECK(ex2.tokens == Ids{15496, 995, kEod, kEod, kEod});
  CHECK(ex2.is_virtual == Flags{0, 0, 1, 1, 0});
  CHECK(ex2.answer_start == -1);
  CHECK(ex2.answer_length == 0);
  CHECK(ex2.prompt_length == 4);
  CHECK(ex2.answer_tokens.empty());
}

TEST_CASE("field values are plain text, empty and spaced values keep the natural ids", "[example]") {
  const auto t = parse_task_template(
      task("s", "<|VIRTUAL_PROMPT_0|> Line: {text} Speaker: {label}", {"text", "label"}, {1}, "label"), 64);
  SECTION("markers and braces inside a value are text") {
    const auto ex = make({{"text", "<|VIRTUAL_PROMPT_0|> {label}"}, {"label", "x"}}, t, options());
    CHECK(ex.tokens == cat({Ids{kEod}, ids(" Line: <|VIRTUAL_PROMPT_0|> {label} Speaker: x"), Ids{kEod}}));
    CHECK(std::count(ex.is_virtual.begin(), ex.is_virtual.end(), 1) == 1);
  }
  SECTION("an empty value is the template's space alone") {
    const auto ex = make({{"text", ""}, {"label", "x"}}, t, options());
    CHECK(ex.tokens == cat({Ids{kEod}, ids(" Line:  Speaker: x"), Ids{kEod}}));
    CHECK(ids(" ") == Ids{220});
  }
  SECTION("a value with its own spaces") {
    const auto ex = make({{"text", "  two spaces before, one after "}, {"label", "x"}}, t, options());
    CHECK(ex.tokens == cat({Ids{kEod}, ids(" Line:   two spaces before, one after  Speaker: x"), Ids{kEod}}));
  }
  SECTION("non-ASCII text") {
    const auto ex = make({{"text", "caf\xC3\xA9 \xE2\x80\x94 na\xC3\xAFve"}, {"label", "\xE6\x97\xA5\xE6\x9C\xAC"}},
                         t, options());
    CHECK(ex.tokens == cat({Ids{kEod}, ids(" Line: caf\xC3\xA9 \xE2\x80\x94 na\xC3\xAFve Speaker: \xE6\x97\xA5\xE6\x9C\xAC"),
                            Ids{kEod}}));
    CHECK(ex.answer_tokens == ids(" \xE6\x97\xA5\xE6\x9C\xAC"));
    CHECK(ex.answer_length == static_cast<int64_t>(ex.answer_tokens.size()) + 1);
  }
}

TEST_CASE("too long records are cut in truncate_field, or dropped", "[example]") {
  const auto t = parse_task_template(task("sentiment", "<|VIRTUAL_PROMPT_0|> Review: {review} Sentiment: {label}",
                                          {"review", "label"}, {2}, "label", true, "review"),
                                     64);
  const PromptRecord r{{"review", "great movie and a fine cast"}, {"label", "positive"}};
  const Ids review = ids(" great movie and a fine cast");
  REQUIRE(review.size() == 6);
  const Ids head = ids(" Review:"), tail = ids(" Sentiment:"), answer = ids(" positive");
  REQUIRE(head.size() == 2);
  REQUIRE(tail.size() == 3);
  REQUIRE(answer == Ids{3967});
  // Untruncated: 2 virtual + 2 + 6 + 3 + 1 + EOS = 15 tokens.
  CHECK(make(r, t, options(15)).truncated == 0);
  CHECK(make(r, t, options(15)).size() == 15);

  SECTION("cut to fit: the field's last ids go") {
    const auto ex = make(r, t, options(12));
    CHECK(ex.tokens == cat({repeat(kEod, 2), head, Ids(review.begin(), review.begin() + 3), tail, answer, Ids{kEod}}));
    CHECK(ex.size() == 12);
    CHECK(ex.truncated == 3);
    CHECK(ex.answer_start == 10);
    CHECK(ex.answer_length == 2);
    CHECK(ex.is_virtual == flags({{1, 2}, {0, 10}}));
  }
  SECTION("the field may become empty") {
    const auto ex = make(r, t, options(9));
    CHECK(ex.tokens == cat({repeat(kEod, 2), head, tail, answer, Ids{kEod}}));
    CHECK(ex.truncated == 6);
  }
  SECTION("dropped when the field is too short to make it fit") {
    CHECK(!make_prompt_example(r, 0, t, gpt2(), options(8)));
  }
  SECTION("dropped when there is no truncate_field") {
    const auto t2 = parse_task_template(task("sentiment", "<|VIRTUAL_PROMPT_0|> Review: {review} Sentiment: {label}",
                                             {"review", "label"}, {2}, "label", true),
                                        64);
    CHECK(make_prompt_example(r, 0, t2, gpt2(), options(15)));
    CHECK(!make_prompt_example(r, 0, t2, gpt2(), options(14)));
  }
  SECTION("a long answer is never cut") {
    const PromptRecord long_answer{{"review", "ok"}, {"label", "positive positive positive positive positive"}};
    CHECK(!make_prompt_example(long_answer, 0, t, gpt2(), options(12)));
  }
  SECTION("an inference example is cut the same way, without answer and EOS") {
    auto o = options(10);
    o.for_inference = true;
    const auto ex = make(r, t, o);
    CHECK(ex.tokens == cat({repeat(kEod, 2), head, Ids(review.begin(), review.begin() + 3), tail}));
    CHECK(ex.truncated == 3);
  }
}

TEST_CASE("inference examples stop before the answer", "[example]") {
  const auto t = parse_task_template(
      task("speaker", "<|VIRTUAL_PROMPT_0|> Line: {text} Speaker: {label}", {"text", "label"}, {3}, "label", true), 64);
  const Ids prompt = cat({repeat(kEod, 3), ids(" Line: I am here Speaker:")});
  SECTION("for_inference with the gold answer present") {
    auto o = options();
    o.for_inference = true;
    const auto ex = make({{"text", "I am here"}, {"label", "Romeo"}}, t, o);
    CHECK(ex.inference);
    CHECK(ex.tokens == prompt);
    CHECK(ex.is_virtual == flags({{1, 3}, {0, static_cast<int64_t>(prompt.size()) - 3}}));
    CHECK(ex.answer_start == -1);
    CHECK(ex.answer_length == 0);
    CHECK(ex.prompt_length == ex.size());
    CHECK(ex.answer_tokens == Ids{43989});
    // The training example's prompt is the same ids.
    const auto train = make({{"text", "I am here"}, {"label", "Romeo"}}, t, options());
    CHECK(Ids(train.tokens.begin(), train.tokens.begin() + train.prompt_length) == ex.tokens);
  }
  SECTION("a record without its answer") {
    const auto ex = make({{"text", "I am here"}}, t, options());
    CHECK(ex.inference);
    CHECK(ex.tokens == prompt);
    CHECK(ex.answer_tokens.empty());
  }
  SECTION("with BOS") {
    auto o = options();
    o.add_bos = true;
    const auto ex = make({{"text", "I am here"}}, t, o);
    CHECK(ex.tokens == cat({Ids{kEod}, prompt}));
  }
  SECTION("a task without answer_field: the whole template, no EOS") {
    const auto t2 = parse_task_template(task("lm", "<|VIRTUAL_PROMPT_0|>{text}", {"text"}, {1}), 64);
    auto o = options();
    o.for_inference = true;
    const auto ex = make({{"text", "Hello world"}}, t2, o);
    CHECK(ex.tokens == Ids{kEod, 15496, 995});
    CHECK(ex.prompt_length == 3);
  }
}

TEST_CASE("examples without a label are dropped, bad records are errors", "[example]") {
  const auto t = parse_task_template(task("x", "{text}", {"text"}, {}), 64);
  auto o = options();
  o.add_eos = false;
  CHECK(!make_prompt_example({{"text", "a"}}, 0, t, gpt2(), o));  // one token, nothing to predict
  CHECK(make_prompt_example({{"text", "a b"}}, 0, t, gpt2(), o));
  o.for_inference = true;
  CHECK(make_prompt_example({{"text", "a"}}, 0, t, gpt2(), o));
  CHECK(!make_prompt_example({{"text", ""}}, 0, t, gpt2(), o));

  const auto t2 = parse_task_template(task("s", "{text} is {label}", {"text", "label"}, {}, "label"), 64);
  CHECK(record_problem({{"label", "x"}}, t2, false) ==
        std::string("task 's': the record has no field 'text'; expected every field of prompt_template_fields "
                    "[text, label]"));
  CHECK(record_problem({{"text", "x"}}, t2, true) ==
        std::string("task 's': the record has no answer field 'label'; only inference records may leave out the "
                    "answer"));
  CHECK(!record_problem({{"text", "x"}}, t2, false));
  CHECK(record_problem({{"text", "x"}, {"label", "y"}, {"extra", "z"}}, t2, false) ==
        std::string("task 's': key 'extra' is not a field of the task; expected 'taskname' or one of "
                    "prompt_template_fields [text, label]"));
  CHECK_THROWS_WITH(make_prompt_example({{"label", "x"}}, 0, t2, gpt2(), options()),
                    "task 's': the record has no field 'text'; expected every field of prompt_template_fields "
                    "[text, label]");
  CHECK_THROWS_AS(make_prompt_example({{"text", "x"}}, 0, t2, gpt2(), options(0)), data::DataError);
}
