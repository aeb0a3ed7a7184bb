// Prompt-learning task templates (docs/design/ptuning.md, "Templates and records"): a
// config::TaskTemplate (one entry of model.task_templates) checked against every rule and cut
// into pieces — literal text, `{field}` placeholders and `<|VIRTUAL_PROMPT_k|>` markers — in
// template order. prompt_example.h turns a record into token ids piece by piece.
//
// Template syntax:
// - `<|VIRTUAL_PROMPT_k|>` (k a decimal number without leading zeros) stands for
//   virtual_token_splits[k] virtual tokens. Anything else starting with `<|VIRTUAL_PROMPT` is
//   a malformed marker (an error); other `<|...|>` text (e.g. `<|endoftext|>`) is literal text
//   and is tokenised as ordinary text, like every literal.
// - `{name}` is the placeholder of field `name`; braces are reserved for placeholders, so an
//   unmatched `{` or `}` is an error (there is no escape for literal braces).
// - Leading space: a placeholder directly preceded by a space takes that one space: the field
//   is tokenised as " " + value, and the literal before it loses its last space (a literal that
//   becomes empty disappears). GPT-2's pre-tokenisation attaches a space to the word after it
//   (" world" is one token), so "Line: {text}" tokenised piecewise as "Line:" + " " + value
//   gives the ids of the whole string "Line: <value>" whenever the pieces meet at word
//   boundaries. Only a space (U+0020) is taken, never a newline or tab, and a marker never
//   takes a space ("Q: <|VIRTUAL_PROMPT_0|>" keeps "Q: " whole, as NeMo's tokenisation did).
//
// Rules (checked for every task before anything runs; each problem names the task and the
// key; see TemplateProblem):
//   taskname non-empty and unique in the list;
//   virtual_token_splits: every split >= 1, sum == total_virtual_tokens (total >= 0; a task
//     with no splits and total 0 has no virtual tokens, e.g. a no-prompt baseline);
//   one marker per split, the i-th marker in the template numbered i (0, 1, ... once each);
//   no malformed marker, no unmatched brace, no empty `{}`;
//   every placeholder names a field of prompt_template_fields; every listed field is unique,
//     non-empty, not "taskname" (the record key) and has exactly one placeholder;
//   answer_only_loss needs answer_field; answer_field is a listed field whose placeholder ends
//     the template (the template's last characters);
//   truncate_field is a listed field other than answer_field;
//   total_virtual_tokens < max_seq_length (a record needs at least one real token), when
//     max_seq_length is known.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/recipe.h"
#include "data/data_error.h"

namespace loom::prompt_data {

/// One piece of a parsed template.
struct TemplatePiece {
  enum class Kind { kText, kField, kVirtual };
  Kind kind = Kind::kText;
  /// kText: the literal text (never empty).
  std::string text;
  /// kField: the field name (a prompt_template_fields entry).
  std::string field;
  /// kField: the space before the placeholder belongs to the field (tokenised " " + value).
  bool leading_space = false;
  /// kVirtual: the marker number k.
  int64_t marker = -1;
  /// kVirtual: the task's virtual tokens [first_virtual, first_virtual + num_virtual), i.e.
  /// sum(splits[<k]) and splits[k].
  int64_t first_virtual = 0;
  int64_t num_virtual = 0;

  bool operator==(const TemplatePiece& o) const {
    return kind == o.kind && text == o.text && field == o.field && leading_space == o.leading_space &&
           marker == o.marker && first_virtual == o.first_virtual && num_virtual == o.num_virtual;
  }
};

/// A task template that passed every rule, as pieces in template order.
struct ParsedTemplate {
  config::TaskTemplate spec;          ///< the recipe entry it came from
  std::vector<TemplatePiece> pieces;  ///< in template order
  /// Index in `pieces` of answer_field's placeholder (always the last piece), if any.
  std::optional<size_t> answer_piece;
  /// Index in `pieces` of truncate_field's placeholder, if any.
  std::optional<size_t> truncate_piece;

  const std::string& taskname() const { return spec.taskname; }
  int64_t total_virtual_tokens() const { return spec.total_virtual_tokens; }
};

/// One broken rule. `task_index` is the entry of the task list (-1 when the problem is not
/// about one entry); `key` the TaskTemplate key at fault ("virtual_token_splits",
/// "prompt_template", ...), so a recipe loader can point at its line; `message` a whole
/// sentence naming the task and the field, e.g.
/// "task 'sentiment': virtual_token_splits [3, 2] sum to 5, expected total_virtual_tokens 6".
struct TemplateProblem {
  int64_t task_index = -1;
  std::string key;
  std::string message;
  /// "<prefix>[task_index].key", e.g. "model.task_templates[1].virtual_token_splits".
  std::string path(const std::string& prefix = "model.task_templates") const;
};

/// Thrown by the parse functions: every problem found, one message per line in what().
struct TemplateError : data::DataError {
  explicit TemplateError(std::vector<TemplateProblem> problems);
  std::vector<TemplateProblem> problems;
};

/// Every broken rule of the task list (empty when all tasks are fine), in list order. A
/// problem found in one entry does not hide the other entries' problems. Without
/// max_seq_length (a recipe whose max_seq_length comes from the base model, not read yet) the
/// rule total_virtual_tokens < max_seq_length is left out; check again once it is known.
std::vector<TemplateProblem> find_template_problems(const std::vector<config::TaskTemplate>& tasks,
                                                    std::optional<int64_t> max_seq_length);

/// Parses the whole task list; index i of the result is task i (records name tasks by
/// taskname, examples carry this index). Throws TemplateError listing every problem.
std::vector<ParsedTemplate> parse_task_templates(const std::vector<config::TaskTemplate>& tasks,
                                                 std::optional<int64_t> max_seq_length);

/// One task on its own (uniqueness of tasknames is not checked). Throws TemplateError.
ParsedTemplate parse_task_template(const config::TaskTemplate& task, std::optional<int64_t> max_seq_length);

/// Index of `taskname` in `templates`, or -1.
int64_t find_task(const std::vector<ParsedTemplate>& templates, const std::string& taskname);

/// "'a', 'b', 'c'": the task names, for messages.
std::string task_names(const std::vector<ParsedTemplate>& templates);

}  // namespace loom::prompt_data
