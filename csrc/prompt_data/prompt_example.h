// One prompt-learning record turned into token ids (docs/design/ptuning.md, "Templates and
// records"): the template's pieces are tokenised one by one, so the positions of the virtual
// tokens and of the answer are known exactly and never searched for in the ids.
//
// Layout of `tokens` (a training example):
//   [BOS if add_bos] piece 0, piece 1, ... [EOS if add_eos]
// where a literal piece is the ids of its text, a field piece the ids of its value (" " + value
// with the template's leading space, task_template.h), and marker k's piece is splits[k]
// positions holding pad_id, flagged in is_virtual: virtual tokens
// [sum(splits[<k]), sum(splits[<=k])) of the task, so the virtual positions of a record, read
// left to right, are the task's virtual tokens 0, 1, ..., n-1 in order. A field value is
// plain text: braces or `<|VIRTUAL_PROMPT_0|>` inside it are tokenised as ordinary text.
//
// The answer (answer_field's piece, always the last piece) spans
// tokens[answer_start, answer_start + answer_length): its ids and, with add_eos, the EOS after
// them. The ids are piecewise, so equal to tokenising the whole text only where the pieces meet
// at GPT-2 word boundaries (a space or punctuation before a field); the piecewise ids are the
// definition, used alike in training, validation and generation.
//
// An inference example (options.for_inference, or a record without its answer) holds only the
// tokens before the answer (no answer, no EOS), so generation continues from there; a task
// without answer_field then holds the whole template without the EOS.
//
// Truncation: when the tokens exceed max_seq_length, tokens are dropped from the end of
// truncate_field's ids (never virtual tokens, literals or the answer) until the example has
// exactly max_seq_length tokens; the field may become empty. When there is no truncate_field,
// or the field has too few ids, the record is dropped (nullopt). Records with fewer than 2
// tokens (training; no label) or 0 tokens (inference) are dropped too.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "prompt_data/task_template.h"

namespace loom::prompt_data {

/// The string fields of one record by field name, without "taskname".
using PromptRecord = std::map<std::string, std::string>;

struct ExampleOptions {
  bool add_bos = false;        ///< prepend bos_id
  bool add_eos = true;         ///< append eod_id after the answer (training examples only)
  int64_t max_seq_length = 0;  ///< most tokens of one example, BOS/EOS/virtual included; >= 1
  /// The tokenizer's ids (data::Tokenizer's bos_id, eod_id, pad_id); GPT-2's `<|endoftext|>`
  /// is all three.
  int64_t bos_id = 50256;
  int64_t eod_id = 50256;      ///< EOS
  int64_t pad_id = 50256;      ///< id at virtual positions (and of batch padding)
  bool for_inference = false;  ///< stop every example before its answer (see above)
};

/// Options with `tokenizer`'s bos, eod and pad ids, the other fields at their defaults.
ExampleOptions example_options(const data::Tokenizer& tokenizer);

struct PromptExample {
  int64_t task = -1;                ///< index of its template in the task list
  std::vector<int64_t> tokens;      ///< [n] ids; virtual positions hold pad_id
  std::vector<uint8_t> is_virtual;  ///< [n] 1 at virtual positions
  /// First answer token in `tokens`, -1 when the example holds no answer (task without
  /// answer_field, or an inference example).
  int64_t answer_start = -1;
  /// Answer tokens, EOS included with add_eos; 0 when no answer.
  int64_t answer_length = 0;
  /// Tokens before the answer (where generation starts): answer_start when there is an
  /// answer, else tokens.size() minus the EOS (if any).
  int64_t prompt_length = 0;
  /// tokens stop before the answer (no answer, no EOS): an inference example.
  bool inference = false;
  /// The answer field's ids (the leading space included, no EOS), when the record has an
  /// answer: the target of exact-match scoring. Also set for inference examples.
  std::vector<int64_t> answer_tokens;
  /// Ids cut from the end of truncate_field.
  int64_t truncated = 0;

  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
};

/// Why `record` does not fit `tmpl`, or nullopt when it does: a key that is not a template
/// field, or a missing field (the answer field only when `answer_required`). The message
/// names the task and the field: "task 'sentiment': the record has no field 'text' ...".
std::optional<std::string> record_problem(const PromptRecord& record, const ParsedTemplate& tmpl,
                                          bool answer_required);

/// The example of `record` for task index `task` (recorded in the example), or nullopt when it
/// is dropped (too long, see above). Throws data::DataError with record_problem's message
/// (answer not required) or when options.max_seq_length < 1.
std::optional<PromptExample> make_prompt_example(const PromptRecord& record, int64_t task, const ParsedTemplate& tmpl,
                                                 const data::Tokenizer& tokenizer, const ExampleOptions& options);

}  // namespace loom::prompt_data
