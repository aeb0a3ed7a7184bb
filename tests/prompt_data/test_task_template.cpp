// Task templates: pieces of valid templates and every rule with its exact message.
#include <catch2/catch.hpp>

#include "prompt_data/task_template.h"
#include "prompt_test_util.h"

using namespace loom;
using namespace loom::prompt_data;
using namespace loom::prompt_data::test;
using Kind = TemplatePiece::Kind;

namespace {

TemplatePiece text(const std::string& s) {
  TemplatePiece p;
  p.kind = Kind::kText;
  p.text = s;
  return p;
}

TemplatePiece field(const std::string& f, bool space) {
  TemplatePiece p;
  p.kind = Kind::kField;
  p.field = f;
  p.leading_space = space;
  return p;
}

TemplatePiece marker(int64_t k, int64_t first, int64_t n) {
  TemplatePiece p;
  p.kind = Kind::kVirtual;
  p.marker = k;
  p.first_virtual = first;
  p.num_virtual = n;
  return p;
}

// Messages of every problem of one task (max_seq_length 64).
std::vector<std::string> messages(const config::TaskTemplate& t, int64_t max_seq_length = 64) {
  std::vector<std::string> out;
  for (const auto& p : find_template_problems({t}, max_seq_length)) out.push_back(p.message);
  return out;
}

// The one problem of one task: its key and message.
std::pair<std::string, std::string> only_problem(const config::TaskTemplate& t, int64_t max_seq_length = 64) {
  const auto problems = find_template_problems({t}, max_seq_length);
  REQUIRE(problems.size() == 1);
  CHECK(problems[0].task_index == 0);
  return {problems[0].key, problems[0].message};
}

using Pair = std::pair<std::string, std::string>;
using Strings = std::vector<std::string>;

}  // namespace

TEST_CASE("templates split into text, fields and markers in order", "[template]") {
  SECTION("marker first, fields with and without a leading space") {
    const auto t = parse_task_template(
        task("speaker", "<|VIRTUAL_PROMPT_0|> Line: {text} Speaker:{label}", {"text", "label"}, {4}, "label"), 64);
    CHECK(t.pieces == std::vector<TemplatePiece>{marker(0, 0, 4), text(" Line:"), field("text", true),
                                                 text(" Speaker:"), field("label", false)});
    CHECK(t.answer_piece == size_t{4});
    CHECK(!t.truncate_piece);
    CHECK(t.taskname() == "speaker");
    CHECK(t.total_virtual_tokens() == 4);
  }
  SECTION("markers at start, middle and end; splits [3, 2, 1]") {
    const auto t = parse_task_template(
        task("qa", "<|VIRTUAL_PROMPT_0|>Context: {context}<|VIRTUAL_PROMPT_1|> Question: {question}"
                   "<|VIRTUAL_PROMPT_2|>",
             {"context", "question"}, {3, 2, 1}, std::nullopt, false, "context"),
        64);
    CHECK(t.pieces == std::vector<TemplatePiece>{marker(0, 0, 3), text("Context:"), field("context", true),
                                                 marker(1, 3, 2), text(" Question:"), field("question", true),
                                                 marker(2, 5, 1)});
    CHECK(!t.answer_piece);
    CHECK(t.truncate_piece == size_t{2});
  }
  SECTION("a field right after a marker takes the space; a marker never does") {
    const auto t = parse_task_template(
        task("s", "Q: <|VIRTUAL_PROMPT_0|> {q}<|VIRTUAL_PROMPT_1|>{a}", {"q", "a"}, {3, 2}, "a", true), 64);
    CHECK(t.pieces == std::vector<TemplatePiece>{text("Q: "), marker(0, 0, 3), field("q", true), marker(1, 3, 2),
                                                 field("a", false)});
    CHECK(t.answer_piece == size_t{4});
  }
  SECTION("only one space goes to the field; newlines stay in the text") {
    const auto t = parse_task_template(task("s", "a  {x}\n{y} ", {"x", "y"}, {}), 64);
    CHECK(t.pieces == std::vector<TemplatePiece>{text("a "), field("x", true), text("\n"), field("y", false),
                                                 text(" ")});
  }
  SECTION("no virtual tokens; other <|...|> text is literal") {
    const auto t = parse_task_template(task("plain", "<|endoftext|>{x}", {"x"}, {}), 64);
    CHECK(t.pieces == std::vector<TemplatePiece>{text("<|endoftext|>"), field("x", false)});
  }
  SECTION("the whole list keeps its order") {
    const auto ts = parse_task_templates(
        {task("a", "<|VIRTUAL_PROMPT_0|>{x}", {"x"}, {2}), task("b", "<|VIRTUAL_PROMPT_0|>{y}", {"y"}, {1})}, 8);
    REQUIRE(ts.size() == 2);
    CHECK(ts[1].taskname() == "b");
    CHECK(find_task(ts, "b") == 1);
    CHECK(find_task(ts, "c") == -1);
    CHECK(task_names(ts) == "'a', 'b'");
  }
}

TEST_CASE("template rules: virtual tokens", "[template]") {
  auto t = task("sentiment", "<|VIRTUAL_PROMPT_0|><|VIRTUAL_PROMPT_1|>{x}", {"x"}, {3, 2});
  t.total_virtual_tokens = 6;
  CHECK(only_problem(t) ==
        Pair{"virtual_token_splits",
             "task 'sentiment': virtual_token_splits [3, 2] sum to 5, expected total_virtual_tokens 6"});

  t = task("sentiment", "<|VIRTUAL_PROMPT_0|><|VIRTUAL_PROMPT_1|>{x}", {"x"}, {3, 0});
  CHECK(only_problem(t) ==
        Pair{"virtual_token_splits",
             "task 'sentiment': virtual_token_splits[1] is 0; expected a positive number of virtual tokens"});

  t = task("sentiment", "{x}", {"x"}, {});
  t.total_virtual_tokens = -1;
  CHECK(only_problem(t) == Pair{"total_virtual_tokens", "task 'sentiment': total_virtual_tokens is -1; expected a "
                                                        "number >= 0"});

  t = task("sentiment", "<|VIRTUAL_PROMPT_0|>{x}", {"x"}, {2});
  CHECK(find_template_problems({t}, 64).empty());

  t = task("sentiment", "<|VIRTUAL_PROMPT_0|>{x}", {"x"}, {2, 1});
  CHECK(only_problem(t) == Pair{"prompt_template", "task 'sentiment': prompt_template has 1 <|VIRTUAL_PROMPT_k|> "
                                                   "marker but virtual_token_splits has 2 entries; expected one "
                                                   "marker per split"});

  t = task("sentiment", "<|VIRTUAL_PROMPT_0|>{x}<|VIRTUAL_PROMPT_1|>", {"x"}, {3});
  CHECK(only_problem(t) == Pair{"prompt_template", "task 'sentiment': prompt_template has 2 <|VIRTUAL_PROMPT_k|> "
                                                   "markers but virtual_token_splits has 1 entry; expected one "
                                                   "marker per split"});

  t = task("sentiment", "<|VIRTUAL_PROMPT_1|>{x}<|VIRTUAL_PROMPT_0|>", {"x"}, {3, 2});
  CHECK(only_problem(t) == Pair{"prompt_template", "task 'sentiment': marker 0 of prompt_template is "
                                                   "<|VIRTUAL_PROMPT_1|>; expected <|VIRTUAL_PROMPT_0|> (markers "
                                                   "are numbered 0, 1, ... in template order, each once)"});

  t = task("sentiment", "<|VIRTUAL_PROMPT_0|>{x}<|VIRTUAL_PROMPT_0|>", {"x"}, {3, 2});
  CHECK(only_problem(t) == Pair{"prompt_template", "task 'sentiment': marker 1 of prompt_template is "
                                                   "<|VIRTUAL_PROMPT_0|>; expected <|VIRTUAL_PROMPT_1|> (markers "
                                                   "are numbered 0, 1, ... in template order, each once)"});

  t = task("sentiment", "<|VIRTUAL_PROMPT_0|>{x}", {"x"}, {64});
  CHECK(only_problem(t, 64) ==
        Pair{"total_virtual_tokens", "task 'sentiment': total_virtual_tokens 64 does not fit max_seq_length 64; "
                                     "expected fewer virtual tokens than max_seq_length (a record needs tokens of "
                                     "its own)"});
  CHECK(find_template_problems({t}, 65).empty());
  CHECK(find_template_problems({t}, std::nullopt).empty());  // max_seq_length not known yet
}

TEST_CASE("template rules: malformed markers and braces", "[template]") {
  const std::string expected_k = "; expected <|VIRTUAL_PROMPT_k|> with k = 0, 1, ...";
  for (const auto& [tmpl, shown] : std::vector<Pair>{
           {"<|VIRTUAL_PROMPT_x|>{x}", "<|VIRTUAL_PROMPT_x|>{x}"},
           {"<|VIRTUAL_PROMPT_|>{x}", "<|VIRTUAL_PROMPT_|>{x}"},
           {"<|VIRTUAL_PROMPT|>{x}", "<|VIRTUAL_PROMPT|>{x}"},
           {"<|VIRTUAL_PROMPT_00|>{x}", "<|VIRTUAL_PROMPT_00|>{x}"},
           {"<|VIRTUAL_PROMPT_0>{x}", "<|VIRTUAL_PROMPT_0>{x}"},
           {"<|VIRTUAL_PROMPT_0 and then a long tail|>{x}", "<|VIRTUAL_PROMPT_0 and t..."},
       }) {
    INFO(tmpl);
    const auto problems = find_template_problems({task("t", tmpl, {"x"}, {})}, 64);
    REQUIRE(!problems.empty());
    CHECK(problems[0].key == "prompt_template");
    CHECK(problems[0].message ==
          "task 't': prompt_template has a malformed marker '" + shown + "' at offset 0" + expected_k);
  }
  CHECK(only_problem(task("t", "a {x", {"x"}, {})) ==
        Pair{"prompt_template", "task 't': prompt_template has an unmatched '{' at offset 2 ('{x'); braces are "
                                "reserved for {field} placeholders"});
  CHECK(messages(task("t", "a {{x}", {"x"}, {})) ==
        Strings{"task 't': prompt_template has an unmatched '{' at offset 2 ('{{x}'); braces are reserved for "
                "{field} placeholders"});
  CHECK(only_problem(task("t", "{x} }", {"x"}, {})) ==
        Pair{"prompt_template", "task 't': prompt_template has an unmatched '}' at offset 4; braces are reserved "
                                "for {field} placeholders"});
  CHECK(only_problem(task("t", "{x} {}", {"x"}, {})) ==
        Pair{"prompt_template", "task 't': prompt_template has an empty placeholder {} at offset 4"});
}

TEST_CASE("template rules: fields and placeholders", "[template]") {
  CHECK(only_problem(task("t", "{x} {y}", {"x"}, {})) ==
        Pair{"prompt_template", "task 't': prompt_template has placeholder {y}, which is not in "
                                "prompt_template_fields [x]"});
  CHECK(only_problem(task("t", "{x}", {"x", "y"}, {})) ==
        Pair{"prompt_template_fields", "task 't': prompt_template_fields lists 'y' but prompt_template has no {y} "
                                       "placeholder"});
  CHECK(only_problem(task("t", "{x} {x}", {"x"}, {})) ==
        Pair{"prompt_template", "task 't': prompt_template has 2 placeholders {x}; expected exactly one per field"});
  CHECK(only_problem(task("t", "{x}", {"x", "x"}, {})) ==
        Pair{"prompt_template_fields", "task 't': prompt_template_fields lists 'x' twice; expected each field once"});
  CHECK(messages(task("t", "{x}", {"x", ""}, {})) ==
        Strings{"task 't': prompt_template_fields[1] is empty; expected a field name"});
  CHECK(only_problem(task("t", "{taskname}", {"taskname"}, {})) ==
        Pair{"prompt_template_fields", "task 't': prompt_template_fields[0] is 'taskname', the record key that "
                                       "names the task; expected another field name"});
  CHECK(messages(task("t", "{x}", {"x", "a}b"}, {})) ==
        Strings{"task 't': prompt_template_fields[1] 'a}b' contains a brace; expected a name that can be written as "
                "a {field} placeholder",
                "task 't': prompt_template_fields lists 'a}b' but prompt_template has no {a}b} placeholder"});
}

TEST_CASE("template rules: answer and truncate fields", "[template]") {
  CHECK(only_problem(task("t", "{x} {y}", {"x", "y"}, {}, std::nullopt, true)) ==
        Pair{"answer_field", "task 't': answer_only_loss is true but answer_field is null; expected the field that "
                             "holds the answer"});
  CHECK(only_problem(task("t", "{x} {y}", {"x", "y"}, {}, "z")) ==
        Pair{"answer_field", "task 't': answer_field 'z' is not in prompt_template_fields [x, y]"});
  CHECK(only_problem(task("t", "{y} then {x}", {"x", "y"}, {}, "y")) ==
        Pair{"answer_field", "task 't': answer_field 'y' must end prompt_template: expected it to end with {y}, "
                             "found '{y} then {x}'"});
  CHECK(only_problem(task("t", "Sentence: {x} Answer: {y}.", {"x", "y"}, {}, "y")) ==
        Pair{"answer_field", "task 't': answer_field 'y' must end prompt_template: expected it to end with {y}, "
                             "found '...ntence: {x} Answer: {y}.'"});
  CHECK(only_problem(task("t", "{x} {y}<|VIRTUAL_PROMPT_0|>", {"x", "y"}, {1}, "y")) ==
        Pair{"answer_field", "task 't': answer_field 'y' must end prompt_template: expected it to end with {y}, "
                             "found '... {y}<|VIRTUAL_PROMPT_0|>'"});
  CHECK(only_problem(task("t", "{x} {y}", {"x", "y"}, {}, "y", false, "z")) ==
        Pair{"truncate_field", "task 't': truncate_field 'z' is not in prompt_template_fields [x, y]"});
  CHECK(only_problem(task("t", "{x} {y}", {"x", "y"}, {}, "y", false, "y")) ==
        Pair{"truncate_field", "task 't': truncate_field 'y' is the answer_field; expected another field (the answer "
                             "is never cut)"});
  // A valid answer-only task with a truncate field.
  CHECK(find_template_problems({task("t", "{x} {y}", {"x", "y"}, {}, "y", true, "x")}, 64).empty());
}

TEST_CASE("template rules: task names and the whole list", "[template]") {
  CHECK(find_template_problems({}, 64).size() == 1);
  CHECK(find_template_problems({}, 64)[0].message == "task_templates is empty; expected at least one task");

  const auto problems = find_template_problems(
      {task("a", "{x}", {"x"}, {}), task("", "{x}", {"x"}, {}), task("b", "{x} {y}", {"x"}, {}),
       task("a", "{x}", {"x"}, {})},
      64);
  REQUIRE(problems.size() == 3);
  CHECK(problems[0].task_index == 1);
  CHECK(problems[0].key == "taskname");
  CHECK(problems[0].message == "task_templates[1] (empty taskname): taskname is empty; expected a non-empty task name");
  CHECK(problems[0].path() == "model.task_templates[1].taskname");
  CHECK(problems[1].task_index == 2);
  CHECK(problems[1].message ==
        "task 'b': prompt_template has placeholder {y}, which is not in prompt_template_fields [x]");
  CHECK(problems[2].task_index == 3);
  CHECK(problems[2].message == "task 'a': taskname is also used by task_templates[0]; expected unique tasknames");
  CHECK(problems[2].path("prompt.tasks") == "prompt.tasks[3].taskname");

  // parse_task_templates throws all of them at once, as a DataError.
  try {
    parse_task_templates({task("a", "{x}", {"x"}, {}), task("a", "{y}", {"x"}, {})}, 64);
    FAIL("no error");
  } catch (const TemplateError& e) {
    CHECK(e.problems.size() == 2);
    CHECK(std::string(e.what()) ==
          "task 'a': prompt_template has placeholder {y}, which is not in prompt_template_fields [x]\n"
          "task 'a': taskname is also used by task_templates[0]; expected unique tasknames");
  }
  CHECK_THROWS_AS(parse_task_template(task("t", "{x}", {}, {}), 64), data::DataError);
}

TEST_CASE("several problems of one task are all reported", "[template]") {
  auto t = task("t", "<|VIRTUAL_PROMPT_1|> {x} {y} {z}", {"x", "y", "w"}, {2, 2}, "q", false, "x");
  CHECK(messages(t) ==
        Strings{"task 't': prompt_template has placeholder {z}, which is not in prompt_template_fields [x, y, w]",
                "task 't': answer_field 'q' is not in prompt_template_fields [x, y, w]"});
  t = task("t", "<|VIRTUAL_PROMPT_1|> {x} {y}", {"x", "y", "w"}, {2, 2}, "y");
  CHECK(messages(t) == Strings{"task 't': prompt_template_fields lists 'w' but prompt_template has no {w} placeholder",
                               "task 't': prompt_template has 1 <|VIRTUAL_PROMPT_k|> marker but virtual_token_splits "
                               "has 2 entries; expected one marker per split",
                               "task 't': marker 0 of prompt_template is <|VIRTUAL_PROMPT_1|>; expected "
                               "<|VIRTUAL_PROMPT_0|> (markers are numbered 0, 1, ... in template order, each once)"});
}
