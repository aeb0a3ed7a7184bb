// GPT-2 byte-level BPE tokenizer (docs/design/formats.md, "GPT-2 byte-level BPE"), loaded from the
// `vocab.json` + `merges.txt` pair that Megatron and NeMo use.
//
// Behaviour follows the reference `tokenizers` package (HF) with
// `Tokenizer(BPE.from_file(vocab, merges))` and `ByteLevel(add_prefix_space=False)`
// pre-tokenisation, i.e. the same ids Megatron's GPT2BPETokenizer produces:
// - text is split by the GPT-2 pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   matched by PCRE2 (UTF + UCP, JIT when available). `\s` is spelled out as the 25 code points
//   of Unicode's White_Space property, which is what the reference treats as whitespace
//   (PCRE2's own \s would add U+180E; Python's isspace would add U+001C..U+001F).
//   \p{L} and \p{N} come from the linked PCRE2's Unicode tables (10.42: Unicode 14.0); the
//   reference uses Unicode 16.0, so only code points first assigned in Unicode 15/16 as letters
//   or digits can tokenise differently.
// - each piece's bytes map to printable characters (byte_unicode.h) and merges apply lowest
//   rank first (all occurrences of the best pair, left to right) until none applies.
// - `<|endoftext|>` inside text is NOT special: it is tokenised as ordinary text, as Megatron's
//   preprocessing does; append eod_id() yourself to end a document.
// - Ill-formed UTF-8 input is repaired first with utf8_replace_invalid (one U+FFFD per maximal
//   subpart), matching the reference fed Python's `raw.decode("utf-8", errors="replace")`.
//   The reference only accepts str, so this is the documented way such bytes reach it.
// Thread safety: a tokenizer is immutable after construction; encode() may be called from any
// number of threads at once (each thread keeps its own piece cache and PCRE2 match data).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/tokenizer.h"

namespace loom::data {

class Gpt2Tokenizer : public Tokenizer {
 public:
  /// Loads the vocabulary (JSON object token -> id) and the merges (optional first line
  /// "#version: ...", then one "left right" pair per line in rank order). Throws
  /// DataError (data_error.h) naming the file and line when a file is missing or malformed, or a merge
  /// names a token absent from the vocabulary.
  Gpt2Tokenizer(const std::string& vocab_json_path, const std::string& merges_path);

  /// The same byte-level BPE from parts already read, e.g. from a Hugging Face tokenizer.json
  /// (hf_tokenizer.h). Throws DataError naming `source` as the constructor above does.
  struct Parts {
    std::string source;                                       ///< the file, for messages
    std::vector<std::pair<std::string, int32_t>> vocab;       ///< entries (byte-to-unicode alphabet) -> id
    std::vector<std::pair<std::string, std::string>> merges;  ///< in rank order
    std::string pattern;         ///< PCRE2 pre-tokenisation pattern (UTF, UCP); empty: GPT-2's
    bool ignore_merges = false;  ///< a piece that is a whole vocabulary entry is that one token
  };
  explicit Gpt2Tokenizer(const Parts& parts);
  /// The GPT-2 pre-tokenisation pattern (as above), which Hugging Face's ByteLevel
  /// pre-tokenizer applies when use_regex is true.
  static const char* gpt2_pattern();
  ~Gpt2Tokenizer() override;
  Gpt2Tokenizer(const Gpt2Tokenizer&) = delete;
  Gpt2Tokenizer& operator=(const Gpt2Tokenizer&) = delete;

  /// Largest id + 1 (50257 for GPT-2).
  size_t vocab_size() const override;
  /// Id of `<|endoftext|>` (50256 for GPT-2), or -1 when the vocabulary has none.
  int32_t eod_id() const override { return eod_id_; }
  /// GPT-2's bos is its eos (`<|endoftext|>`), as in Hugging Face's GPT2Tokenizer.
  int32_t bos_id() const override { return eod_id_; }
  /// `<|endoftext|>` (GPT-2 has no pad token; NeMo and Megatron pad with eod), else 0.
  int32_t pad_id() const override { return eod_id_ >= 0 ? eod_id_ : 0; }
  /// Number of merges loaded (50000 for GPT-2).
  size_t num_merges() const;

  /// Appends the ids of `text` (UTF-8; ill-formed bytes repaired as described above) to `out`.
  void encode(std::string_view text, std::vector<int32_t>& out) const override;
  using Tokenizer::encode;

  /// The exact bytes of the given ids concatenated. decode(encode(t)) == t for valid UTF-8 t.
  /// Throws std::out_of_range naming the id if one is not in the vocabulary.
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::string description() const override;
  /// Bytes of one token.
  const std::string& token_bytes(int32_t id) const;
  /// Id of a vocabulary entry (written in the byte-to-unicode alphabet), or -1.
  int32_t token_id(const std::string& vocab_entry) const;

  /// Splits `text` (must be valid UTF-8) into pre-tokenisation pieces; exposed for tests.
  std::vector<std::string> pretokenize(std::string_view text) const;

 private:
  void build(const Parts& parts);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int32_t eod_id_ = -1;
};

}  // namespace loom::data
