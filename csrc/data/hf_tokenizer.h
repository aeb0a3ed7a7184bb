// A Hugging Face `tokenizer.json` byte-level BPE (GPT-NeoX's, and those whose pre-tokenizer is
// a regex Split followed by ByteLevel, like Llama 3's), with ids equal to the `tokenizers`
// package's `Tokenizer.from_file(path).encode(text, add_special_tokens=False).ids`
// (docs/design/tokenizers.md). What is read:
// - model: type BPE (byte-level: every byte has a token), merges as "a b" strings or [a, b]
//   pairs, ignore_merges; dropout, continuing_subword_prefix, end_of_word_suffix and
//   byte_fallback are refused;
// - normalizer: null, NFC, NFD, NFKC, NFKD or a Sequence of them (utf8proc);
// - pre_tokenizer: ByteLevel (use_regex: GPT-2's pattern; add_prefix_space), or a Sequence of
//   Split (a Regex or String pattern, behavior Isolated) and ByteLevel with use_regex false;
//   regexes run on PCRE2 (UTF + UCP), where `\s` and `\p{..}` follow PCRE2's Unicode tables;
// - added_tokens: split out of the text first (leftmost, then longest), matched on the text
//   before normalization; each is its own id;
// - post_processor: not applied (preprocessing appends the EOD id itself, as Megatron does);
// - decoder: ByteLevel (or none).
// Special ids, from the added tokens (tokenizer.json has no field naming them; the first found):
// end of document `<|endoftext|>`, `<|end_of_text|>`, `</s>`, `<eos>` (else -1); beginning of
// sequence `<|begin_of_text|>`, `<s>`, `<bos>`, `<|startoftext|>` (else the end-of-document id,
// as GPT-2-style vocabularies use one token for both); padding `<pad>`, `<|padding|>`,
// `<|pad|>`, `[PAD]` (else the end-of-document id, else 0).
#pragma once
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace loom::data {

class Gpt2Tokenizer;

class HfTokenizer : public Tokenizer {
 public:
  /// `path`: a tokenizer.json, or a folder holding one. Throws DataError naming the file and
  /// the field for JSON that does not parse, a missing field, or a component Loom does not read.
  explicit HfTokenizer(const std::string& path);
  ~HfTokenizer() override;

  size_t vocab_size() const override { return vocab_size_; }
  int32_t eod_id() const override { return eod_id_; }
  int32_t bos_id() const override { return bos_id_; }
  int32_t pad_id() const override { return pad_id_; }
  void encode(std::string_view text, std::vector<int32_t>& out) const override;
  using Tokenizer::encode;
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::string description() const override { return "Hugging Face tokenizer.json ('" + path_ + "')"; }

 private:
  void encode_segment(std::string_view text, std::vector<int32_t>& out) const;
  int32_t added_id(std::initializer_list<const char*> names) const;  // the first present, else -1

  std::string path_;
  std::unique_ptr<Gpt2Tokenizer> bpe_;
  std::vector<int> normalizers_;  // utf8proc option sets, applied in order
  bool add_prefix_space_ = false;
  struct Added {
    std::string content;
    int32_t id;
  };
  std::vector<Added> added_;
  std::vector<std::string> added_text_;  // id -> content for added ids (empty if none)
  size_t vocab_size_ = 0;
  int32_t eod_id_ = -1, bos_id_ = -1, pad_id_ = 0;
};

}  // namespace loom::data
