// JSONL datasets: multi-task files, every error with file:line, dropped counts, the run's
// sequence length.
#include <catch2/catch.hpp>

#include "prompt_data/prompt_dataset.h"
#include "prompt_test_util.h"

using namespace loom;
using namespace loom::prompt_data;
using namespace loom::prompt_data::test;
using Catch::Matchers::EndsWith;
using Catch::Matchers::StartsWith;
using Ids = std::vector<int64_t>;

namespace {

std::vector<ParsedTemplate> two_tasks() {
  return parse_task_templates(
      {task("sentiment", "<|VIRTUAL_PROMPT_0|> Review: {review} Sentiment: {label}", {"review", "label"}, {2}, "label",
            true, "review"),
       task("speaker", "<|VIRTUAL_PROMPT_0|><|VIRTUAL_PROMPT_1|> Line: {text} Speaker: {name}", {"text", "name"}, {1, 2},
            "name")},
      32);
}

ExampleOptions options(int64_t max_seq_length = 32, bool for_inference = false) {
  ExampleOptions o;
  o.max_seq_length = max_seq_length;
  o.for_inference = for_inference;
  return o;
}

// The DataError message of reading `jsonl` as one file (for the training or inference set).
std::string error_of(const TempDir& dir, const std::string& jsonl, bool for_inference = false) {
  const std::string path = dir.write("bad.jsonl", jsonl);
  try {
    PromptDataset(std::vector<std::string>{path}, two_tasks(), gpt2(), options(32, for_inference));
  } catch (const data::DataError& e) {
    return e.what();
  }
  return "(no error)";
}

const std::string kLong = "a b c d e f g h i j k l m n o p q r s t u v w x y z a b c";  // 29 tokens

}  // namespace

TEST_CASE("multi-task JSONL files become examples in file order", "[dataset]") {
  TempDir dir;
  const std::string f1 = dir.write("train1.jsonl",
                                   "{\"taskname\": \"sentiment\", \"review\": \"great movie\", \"label\": \"positive\"}\n"
                                   "\n"
                                   "   \n"
                                   "{\"name\": \"Romeo\", \"taskname\": \"speaker\", \"text\": \"I am here\"}\r\n"
                                   "{\"taskname\": \"speaker\", \"text\": \"" + kLong + "\", \"name\": \"Juliet\"}\n"
                                   "{\"taskname\": \"sentiment\", \"review\": \"" + kLong + "\", \"label\": \"negative\"}");
  const std::string f2 = dir.write("train2.jsonl",
                                   "{\"taskname\": \"speaker\", \"text\": \"Hello world\", \"name\": \"Nurse\"}\n");
  const auto templates = two_tasks();
  const PromptDataset ds({f1, f2}, templates, gpt2(), options());

  REQUIRE(ds.size() == 4);
  CHECK(ds[0].task == 0);
  CHECK(ds[1].task == 1);
  CHECK(ds[2].task == 0);
  CHECK(ds[3].task == 1);
  CHECK(ds.source(0) == f1 + ":1");
  CHECK(ds.source(1) == f1 + ":4");
  CHECK(ds.source(2) == f1 + ":6");
  CHECK(ds.source(3) == f2 + ":1");
  // Each example is the record's example.
  const auto ex1 = make_prompt_example({{"text", "I am here"}, {"name", "Romeo"}}, 1, templates[1], gpt2(), options());
  REQUIRE(ex1);
  CHECK(ds[1].tokens == ex1->tokens);
  CHECK(ds[1].tokens == cat({repeat(kEod, 3), ids(" Line: I am here Speaker: Romeo"), Ids{kEod}}));
  CHECK(ds[0].tokens == cat({repeat(kEod, 2), ids(" Review: great movie Sentiment: positive"), Ids{kEod}}));
  // The long speaker record cannot be cut (no truncate_field): dropped; the long review is cut.
  CHECK(ds.dropped_per_task() == Ids{0, 1});
  CHECK(ds.dropped() == 1);
  CHECK(ds.truncated() == 1);
  CHECK(ds[2].size() == 32);
  CHECK(ds[2].truncated > 0);
  CHECK(ds.examples_per_task() == Ids{2, 2});
  CHECK(ds.longest_input() == 31);
  CHECK(ds.summary() == "4 examples from 2 files (task 'sentiment': 2, task 'speaker': 2); 1 record longer than "
                        "max_seq_length 32 dropped (task 'speaker': 1); 1 truncated");
  CHECK(ds.templates().size() == 2);
}

TEST_CASE("inference datasets may leave out the answer", "[dataset]") {
  TempDir dir;
  const std::string f = dir.write("test.jsonl",
                                  "{\"taskname\": \"speaker\", \"text\": \"I am here\"}\n"
                                  "{\"taskname\": \"speaker\", \"text\": \"I am here\", \"name\": \"Romeo\"}\n");
  const PromptDataset ds({f}, two_tasks(), gpt2(), options(32, true));
  REQUIRE(ds.size() == 2);
  CHECK(ds[0].inference);
  CHECK(ds[0].tokens == cat({repeat(kEod, 3), ids(" Line: I am here Speaker:")}));
  CHECK(ds[1].tokens == ds[0].tokens);
  CHECK(ds[0].answer_tokens.empty());
  CHECK(ds[1].answer_tokens == ids(" Romeo"));
  CHECK(ds.summary() == "2 examples from 1 file (task 'speaker': 2)");
  CHECK(ds.record(0) == PromptRecord{{"text", "I am here"}});
  CHECK(ds.record(1) == PromptRecord{{"text", "I am here"}, {"name", "Romeo"}});

  // With a default task (loom generate --task) records may leave out "taskname".
  const std::string g = dir.write("generate.jsonl",
                                  "{\"text\": \"I am here\"}\n"
                                  "{\"taskname\": \"sentiment\", \"review\": \"great movie\"}\n");
  const PromptDataset gen({g}, two_tasks(), gpt2(), options(32, true), "speaker");
  REQUIRE(gen.size() == 2);
  CHECK(gen[0].task == 1);
  CHECK(gen[0].tokens == ds[0].tokens);
  CHECK(gen[1].task == 0);
  CHECK_THROWS_WITH(PromptDataset({g}, two_tasks(), gpt2(), options(32, true), "poetry"),
                    "prompt dataset: unknown default task 'poetry'; expected one of the tasks 'sentiment', 'speaker'");
  // Not a dataset to size training batches by.
  CHECK_THROWS_AS(run_sequence_length({&ds}), std::invalid_argument);
}

TEST_CASE("dataset errors name file:line, the task and the key", "[dataset]") {
  TempDir dir;
  const std::string p = dir.path + "/bad.jsonl:";
  const std::string ok = "{\"taskname\": \"speaker\", \"text\": \"a\", \"name\": \"b\"}\n";
  const std::string tasks = "expected one of the tasks 'sentiment', 'speaker'";

  const std::string bad_json = error_of(dir, ok + "\n{\"taskname\": \"speaker\", \"text\": }\n");
  CHECK_THAT(bad_json, StartsWith(p + "3: not valid JSON ([json.exception.parse_error.101]"));
  CHECK_THAT(bad_json, EndsWith("); expected one JSON object per line"));
  CHECK_THAT(error_of(dir, ok + "{\"taskname\": \"speaker\", \"text\": \"a\", \"name\": \"b\"} x\n"),
             StartsWith(p + "2: not valid JSON ("));

  CHECK(error_of(dir, "[1, 2]\n") == p + "1: expected a JSON object (one record per line), found an array");
  CHECK(error_of(dir, ok + "\"text\"\n") == p + "2: expected a JSON object (one record per line), found a string");
  CHECK(error_of(dir, "{\"taskname\": \"speaker\", \"text\": \"a\", \"text\": \"c\", \"name\": \"b\"}\n") ==
        p + "1: key 'text' appears twice in the record");

  CHECK(error_of(dir, "{\"text\": \"a\"}\n") == p + "1: the record has no 'taskname'; " + tasks);
  CHECK(error_of(dir, "{\"taskname\": 3}\n") == p + "1: 'taskname' is a number; expected a string naming one of the "
                                                    "tasks 'sentiment', 'speaker'");
  CHECK(error_of(dir, ok + ok + "{\"taskname\": \"poetry\", \"text\": \"a\"}\n") ==
        p + "3: unknown task 'poetry'; " + tasks);

  CHECK(error_of(dir, "{\"taskname\": \"speaker\", \"text\": \"a\", \"name\": \"b\", \"label\": \"c\"}\n") ==
        p + "1: task 'speaker': key 'label' is not a field of the task; expected 'taskname' or one of "
            "prompt_template_fields [text, name]");
  CHECK(error_of(dir, "{\"taskname\": \"speaker\", \"text\": 12, \"name\": \"b\"}\n") ==
        p + "1: task 'speaker': field 'text' is a number; expected a string");
  CHECK(error_of(dir, "{\"taskname\": \"speaker\", \"text\": null, \"name\": \"b\"}\n") ==
        p + "1: task 'speaker': field 'text' is a null; expected a string");
  CHECK(error_of(dir, "{\"taskname\": \"speaker\", \"text\": [\"a\"], \"name\": \"b\"}\n") ==
        p + "1: task 'speaker': field 'text' is an array; expected a string");
  CHECK(error_of(dir, "{\"taskname\": \"speaker\", \"name\": \"b\"}\n") ==
        p + "1: task 'speaker': the record has no field 'text'; expected every field of prompt_template_fields "
            "[text, name]");
  // The answer may be missing only in an inference dataset.
  CHECK(error_of(dir, ok + "{\"taskname\": \"speaker\", \"text\": \"a\"}\n") ==
        p + "2: task 'speaker': the record has no answer field 'name'; only inference records may leave out the "
            "answer");
  CHECK(error_of(dir, ok + "{\"taskname\": \"speaker\", \"text\": \"a\"}\n", true) == "(no error)");

  try {
    PromptDataset({dir.path + "/missing.jsonl"}, two_tasks(), gpt2(), options());
    FAIL("no error");
  } catch (const data::DataError& e) {
    CHECK_THAT(e.what(), StartsWith(dir.path + "/missing.jsonl: cannot open the JSONL file ("));
  }
  // A line is held whole: an endless one (/dev/zero) is refused at 64 MiB, naming file and line.
  try {
    PromptDataset({"/dev/zero"}, two_tasks(), gpt2(), options());
    FAIL("no error");
  } catch (const data::DataError& e) {
    CHECK_THAT(e.what(), StartsWith("'/dev/zero' line 1: longer than 67108864 bytes without a newline (a record is at "
                                    "most one line of 64 MiB)"));
  }
}

TEST_CASE("the run's sequence length", "[dataset]") {
  SECTION("rounded up to the multiple, capped at max_seq_length") {
    CHECK(round_sequence_length(13, 64) == 16);
    CHECK(round_sequence_length(16, 64) == 16);
    CHECK(round_sequence_length(17, 64) == 24);
    CHECK(round_sequence_length(1, 64) == 8);
    CHECK(round_sequence_length(63, 64) == 64);  // an input of max_seq_length - 1 pads to max_seq_length
    CHECK(round_sequence_length(60, 62) == 60);  // 64 would pass the cap: no rounding
    CHECK(round_sequence_length(61, 62) == 61);
  }
  SECTION("under sequence parallelism the multiple of t is required, the multiple of 8 preferred") {
    CHECK(round_sequence_length(25, 100, 24, 3) == 48);
    CHECK(round_sequence_length(97, 100, 24, 3) == 99);
    CHECK(round_sequence_length(99, 100, 24, 3) == 99);
    CHECK(round_sequence_length(13, 64, 8, 2) == 16);
    CHECK(round_sequence_length(61, 62, 8, 2) == 62);
    CHECK_THROWS_WITH(round_sequence_length(99, 100, 56, 7),
                      "prompt data: the longest model input is 99 tokens; rounded up to a multiple of 7 (sequence "
                      "parallelism) it is 105, above max_seq_length 100; expected max_seq_length to be a multiple "
                      "of 7");
  }
  SECTION("bad arguments") {
    CHECK_THROWS_WITH(round_sequence_length(0, 64), "prompt data: no examples to size the sequence length from");
    CHECK_THROWS_WITH(round_sequence_length(64, 64),
                      "prompt data: the longest model input is 64 tokens; expected at most max_seq_length - 1 = 63");
    CHECK_THROWS_AS(round_sequence_length(10, 64, 8, 3), std::invalid_argument);
    CHECK_THROWS_AS(round_sequence_length(10, 64, 0, 1), std::invalid_argument);
  }
  SECTION("over several datasets") {
    TempDir dir;
    const auto train = dir.write("train.jsonl",
                                 "{\"taskname\": \"speaker\", \"text\": \"I am here\", \"name\": \"Romeo\"}\n");
    const auto val = dir.write("val.jsonl",
                               "{\"taskname\": \"sentiment\", \"review\": \"great movie, and a very fine cast indeed\","
                               " \"label\": \"positive\"}\n");
    const auto empty = dir.write("empty.jsonl", "\n");
    const PromptDataset a({train}, two_tasks(), gpt2(), options());
    const PromptDataset b({val}, two_tasks(), gpt2(), options());
    const PromptDataset c({empty}, two_tasks(), gpt2(), options());
    REQUIRE(a.longest_input() == 11);  // 3 virtual + 8 ids + EOS = 12 tokens
    REQUIRE(b.longest_input() == 17);  // 2 virtual + 15 ids + EOS = 18 tokens
    CHECK(run_sequence_length({&a}) == 16);
    CHECK(run_sequence_length({&a, &b}) == 24);
    CHECK(run_sequence_length({&b, &a}, 48, 3) == 18);  // 48 > max_seq_length 32: a multiple of 3
    CHECK(run_sequence_length({&a}, 24, 3) == 24);
    CHECK(run_sequence_length({&a, &c}) == 16);
    CHECK(c.size() == 0);
    CHECK(c.summary() == "0 examples from 1 file");
    CHECK_THROWS_WITH(run_sequence_length({&c}), "prompt data: no examples to size the sequence length from");
    const PromptDataset d({train}, two_tasks(), gpt2(), options(40));
    CHECK_THROWS_AS(run_sequence_length({&a, &d}), std::invalid_argument);
  }
}
