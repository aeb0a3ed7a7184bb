// Supervised fine-tuning datasets (docs/design/finetune.md, "Examples"): JSON-lines files of
// records, NeMo's GPTSFTDataset options (model.data.train_ds.*). A record is one of
// - a prompt/answer record: an object whose string fields fill prompt_template's `{name}`
//   placeholders (other keys are ignored, as NeMo does); label_key's field ends the template and
//   is the answer. Laid out by prompt_data::make_prompt_example (piecewise ids, the answer and
//   its EOS marked, truncation_field shortened from its end past max_seq_length);
// - a chat record: an object with `messages`, a list of {role, content} objects, rendered with
//   a chat template as transformers' apply_chat_template(messages, tokenize=False) renders it
//   (serve/chat_template.h). The answer tokens are the assistant turns: for assistant message
//   i, the text between render(messages[:i], add_generation_prompt=true) and
//   render(messages[:i+1]) (its content and the turn's closing text), each such text a prefix
//   of the whole conversation's render; text between them is tokenised piece by piece, so the
//   answer positions are exact. No BOS/EOS is added (the template writes its own). Longer than
//   max_seq_length: cut at it, dropped when no answer token is left.
// Every bad record is a data::DataError "FILE:LINE: ..." naming the field.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/recipe.h"
#include "data/tokenizer.h"
#include "prompt_data/task_template.h"
#include "serve/chat_template.h"

namespace loom::finetune {

struct SftExample {
  std::vector<int64_t> tokens;  ///< [n] ids
  /// [n] 1 where the token is part of an answer (prompt/answer: the answer and its EOS; chat:
  /// the assistant turns); answer_only_loss trains on these labels only.
  std::vector<uint8_t> answer;
  bool chat = false;

  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
};

/// How records become examples: the template (parsed from train_ds's prompt_template), the
/// chat template (null: chat records are an error naming model.data.train_ds.chat_template),
/// the tokenizer's ids and max_seq_length.
struct SftLayout {
  prompt_data::ParsedTemplate prompt_template;
  std::shared_ptr<const serve::ChatTemplate> chat_template;
  bool add_bos = false, add_eos = true;
  int64_t max_seq_length = 0;
};

/// train_ds's prompt_template as a template of no virtual tokens: its fields are its
/// placeholders, the answer label_key, truncate_field truncation_field ("" for none). Throws
/// std::invalid_argument naming model.data.train_ds.<key> for a template that breaks a rule
/// (prompt_data/task_template.h: label_key's placeholder must end it, ...).
prompt_data::ParsedTemplate parse_sft_template(const config::SftDatasetConfig& train, int64_t max_seq_length);

class SftDataset {
 public:
  /// Reads `files` in order. Throws data::DataError "FILE:LINE: ..." for a bad record or an
  /// unreadable file, and for a file with no records.
  SftDataset(const std::vector<std::string>& files, const SftLayout& layout, const data::Tokenizer& tokenizer);

  int64_t size() const { return static_cast<int64_t>(examples_.size()); }
  const SftExample& operator[](int64_t i) const { return examples_.at(static_cast<size_t>(i)); }
  /// "FILE:LINE" of example i.
  std::string source(int64_t i) const { return sources_.at(static_cast<size_t>(i)); }
  /// Longest model input (tokens - 1) over the examples; 0 when empty.
  int64_t longest_input() const;
  /// e.g. "120 examples (100 prompt/answer, 20 chat) from 1 file; 2 longer than max_seq_length 64 dropped; 3 truncated"
  std::string summary() const;

 private:
  void read_file(const std::string& path, const SftLayout& layout, const data::Tokenizer& tokenizer);

  std::vector<std::string> files_;
  std::vector<SftExample> examples_;
  std::vector<std::string> sources_;
  int64_t dropped_ = 0, truncated_ = 0, chat_ = 0;
  int64_t max_seq_length_ = 0;
};

}  // namespace loom::finetune
