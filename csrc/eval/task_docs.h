// Evaluation tasks read from local JSONL files in the formats lm-evaluation-harness's tasks
// read, turned into the harness's requests (docs/design/evaluation.md, "Task kinds"):
//
// | kind        | one JSON object per line                                  | harness task  |
// |-------------|-----------------------------------------------------------|---------------|
// | lambada     | {"text"}: context = all but the last ' '-separated word,  | lambada_openai|
// |             | continuation = " " + the last word                         |               |
// | mc          | {"context", "choices": [..], "gold": int}                  | (generic)     |
// | hellaswag   | Rowan/hellaswag rows (activity_label, ctx_a, ctx_b,        | hellaswag     |
// |             | endings, label)                                            |               |
// | piqa        | {"goal", "sol1", "sol2", "label"}                          | piqa          |
// | arc         | {"question", "choices": {"text", "label"}, "answerKey"}    | arc_easy/...  |
// | wikitext    | {"page"} (wikitext_document_level), detokenized            | wikitext      |
// | rolling     | {"text"}: the whole text scored                            | (generic)     |
//
// Multiple-choice continuations are " " + choice (the harness's target_delimiter).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace loom::eval {

enum class TaskKind { kLambada, kMultipleChoice, kHellaswag, kPiqa, kArc, kWikitext, kRolling };

/// "lambada", "mc", ... (the spelling of task specs). Throws EvalInputError for another name,
/// listing the known kinds.
TaskKind task_kind(const std::string& name);
std::string kind_name(TaskKind kind);
/// The harness's output type: "loglikelihood", "multiple_choice" or "loglikelihood_rolling".
std::string output_type(TaskKind kind);

/// One task to run: its name in the results, its kind and its file.
struct TaskSpec {
  std::string name;
  TaskKind kind = TaskKind::kLambada;
  std::string path;
};

/// Parses a comma-separated list of "KIND:PATH" or "NAME=KIND:PATH" (name default: the file
/// name without .jsonl/.json). Throws EvalInputError naming `what` (e.g. "--tasks") and the
/// item: an unknown kind, no path, a kind without a file, names given twice.
std::vector<TaskSpec> parse_task_specs(const std::string& list, const std::string& what);

/// Reads a task file of specs, one per line ('#' starts a comment); relative paths are taken
/// relative to the file's folder. Throws EvalInputError naming FILE:LINE.
std::vector<TaskSpec> read_task_file(const std::string& path);

/// A (context, continuation) pair whose log-likelihood the harness asks for.
struct ContinuationRequest {
  std::string context, continuation;
};

/// One document of a task.
struct EvalDoc {
  int64_t line = 0;                           ///< 1-based line of the file
  nlohmann::json record;                      ///< the JSON object as read
  std::vector<ContinuationRequest> requests;  ///< lambada: 1; multiple choice: one per choice
  std::vector<std::string> choices;           ///< multiple choice: the choices' text (no delimiter)
  int64_t gold = -1;                          ///< multiple choice: index into choices
  std::string target;                         ///< lambada: the continuation; rolling: the text scored
  int64_t words = 0, bytes = 0;               ///< rolling: the harness's word and UTF-8 byte counts
};

struct EvalTask {
  TaskSpec spec;
  std::vector<EvalDoc> docs;  ///< the first `limit` documents
  int64_t total_docs = 0;     ///< documents in the file
};

/// Reads the spec's JSONL file (blank lines skipped; every line is checked, the first `limit`
/// documents kept when limit > 0).
/// Throws EvalInputError "FILE:LINE: ..." for a line that is not a JSON object, a field that is
/// missing or of the wrong type, a gold index out of range, fewer than two choices; "FILE: ..."
/// for a file that cannot be read or holds no documents.
EvalTask read_task(const TaskSpec& spec, int64_t limit = 0);

}  // namespace loom::eval
