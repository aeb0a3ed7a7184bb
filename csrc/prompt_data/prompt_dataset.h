// Prompt-learning datasets (docs/design/ptuning.md): JSONL files of records for a task list,
// turned into PromptExamples (prompt_example.h), and the run's sequence length.
//
// A file holds one JSON object per line (blank lines are skipped; line numbers count every
// line from 1). Each object has "taskname" (a string naming one of the templates; optional
// with a default task) and the task's fields as strings. Every error is a data::DataError starting "FILE:LINE: " and naming
// the task and the key:
//   not valid JSON; not an object; a key twice; no "taskname" / not a string / unknown task
//   (the message lists the known tasks); a key that is neither "taskname" nor a field of the
//   task; a field value that is not a string; a missing field. The answer field may be missing
//   only in an inference dataset (options.for_inference); elsewhere that is an error too.
// Records too long for max_seq_length that cannot be truncated are dropped and counted per
// task (prompt_example.h). Examples keep file order, files the order given. A dataset is
// immutable once read and may be shared between threads.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "prompt_data/prompt_example.h"
#include "prompt_data/task_template.h"

namespace loom::prompt_data {

class PromptDataset {
 public:
  /// Reads `files` in order. `templates` is the parsed task list (examples carry indices into
  /// it); it is copied. A record without "taskname" belongs to `default_task` when that is
  /// given (e.g. `loom generate --task NAME`; it must name a template), else it is an error.
  /// Throws data::DataError as described above, and when a file cannot be opened.
  PromptDataset(const std::vector<std::string>& files, std::vector<ParsedTemplate> templates,
                const data::Tokenizer& tokenizer, const ExampleOptions& options,
                const std::string& default_task = "");

  int64_t size() const { return static_cast<int64_t>(examples_.size()); }
  const PromptExample& operator[](int64_t i) const { return examples_.at(static_cast<size_t>(i)); }
  const std::vector<PromptExample>& examples() const { return examples_; }
  const std::vector<ParsedTemplate>& templates() const { return templates_; }
  const ExampleOptions& options() const { return options_; }

  /// "FILE:LINE" of example i.
  std::string source(int64_t i) const;
  /// The string fields of example i's record (without "taskname"), e.g. to echo them next to a
  /// prediction.
  const PromptRecord& record(int64_t i) const { return records_.at(static_cast<size_t>(i)); }
  /// Records dropped, per task index: too long and not truncatable (or, rarely, too short to
  /// have a label; prompt_example.h).
  const std::vector<int64_t>& dropped_per_task() const { return dropped_; }
  int64_t dropped() const;
  /// Examples kept, per task index.
  std::vector<int64_t> examples_per_task() const;
  /// Records (non-blank lines, kept or dropped) and lines of each file, in the order given.
  const std::vector<int64_t>& records_per_file() const { return records_per_file_; }
  const std::vector<int64_t>& lines_per_file() const { return lines_per_file_; }
  const std::vector<std::string>& files() const { return files_; }
  /// Examples whose truncate_field was cut.
  int64_t truncated() const { return truncated_; }
  /// Longest model input over the examples: max(tokens.size() - 1); 0 when empty.
  int64_t longest_input() const;
  /// One line for the log, e.g. "12 examples from 1 file (task 'a': 8, task 'b': 4); 2 records
  /// longer than max_seq_length 64 dropped (task 'a': 2); 1 truncated".
  std::string summary() const;

 private:
  void read_file(const std::string& path, int32_t file_index, const data::Tokenizer& tokenizer);

  std::vector<std::string> files_;
  std::vector<ParsedTemplate> templates_;
  ExampleOptions options_;
  std::string default_task_;
  std::vector<PromptExample> examples_;
  std::vector<PromptRecord> records_;
  std::vector<std::pair<int32_t, int64_t>> sources_;  // (file index, line) per example
  std::vector<int64_t> records_per_file_, lines_per_file_;
  std::vector<int64_t> dropped_;
  int64_t truncated_ = 0;
};

/// The run's sequence length s (every micro-batch is [b, s], prompt_batch.h) from the longest
/// model input `longest_input` (tokens - 1: inputs are tokens[:-1], labels tokens[1:]):
/// the smallest multiple of `multiple` >= longest_input when it is <= max_seq_length, else the
/// smallest multiple of `required_multiple` >= longest_input when that is <= max_seq_length.
/// Pass multiple = 8 (lcm(8, t) under sequence parallelism) and required_multiple = 1 (t under
/// sequence parallelism: the sequence is split over t ranks, while 8 is only for speed).
///
/// The cap is max_seq_length, not max_seq_length - 1: an example holds at most max_seq_length
/// tokens, so its input at most max_seq_length - 1, and rounding only adds padding positions;
/// positions 0 .. max_seq_length - 1 exist in a base model whose max_position_embeddings is at
/// least max_seq_length (the recipe must check that), as in NeMo, whose padded input length
/// (ceil(tokens, 8)) also reaches max_seq_length. Throws data::DataError when longest_input is
/// outside [1, max_seq_length - 1] ("no examples" for 0), or when no multiple of
/// required_multiple fits (max_seq_length not a multiple of t and the longest input above the
/// last multiple); std::invalid_argument when multiple is not a positive multiple of
/// required_multiple.
int64_t round_sequence_length(int64_t longest_input, int64_t max_seq_length, int64_t multiple = 8,
                              int64_t required_multiple = 1);

/// round_sequence_length over the longest input of all `datasets` (train, validation, test
/// together, so that one length serves the run); max_seq_length is the datasets' (they must
/// agree). Throws data::DataError when the datasets hold no example at all,
/// std::invalid_argument for an inference dataset (its examples have no labels) or differing
/// max_seq_length.
int64_t run_sequence_length(const std::vector<const PromptDataset*>& datasets, int64_t multiple = 8,
                            int64_t required_multiple = 1);

}  // namespace loom::prompt_data
