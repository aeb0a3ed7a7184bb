// One tokenizer interface for preprocessing, training, generation and serving
// (docs/design/tokenizers.md). Implementations: GPT-2 byte-level BPE from vocab.json +
// merges.txt (gpt2_tokenizer.h), Hugging Face tokenizer.json byte-level BPE
// (hf_tokenizer.h), SentencePiece models (sentencepiece_tokenizer.h). make_tokenizer picks one
// from a recipe-style description (NeMo's model.tokenizer keys).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data {

/// Encodes UTF-8 text to token ids and back. Implementations are immutable after construction
/// and encode()/decode() may be called from any number of threads at once.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  /// Largest id + 1: the size the model's vocabulary (before padding) must have.
  virtual size_t vocab_size() const = 0;
  /// The end-of-document id preprocessing appends (--append-eod) and generation stops at:
  /// GPT-2 `<|endoftext|>`, the SentencePiece model's eos, the tokenizer.json's `<|endoftext|>`
  /// or `</s>` added token; -1 when there is none.
  virtual int32_t eod_id() const = 0;
  /// The beginning-of-sequence id: what NeMo's add_BOS (serving) and add_bos (prompt
  /// learning data) prepend. GPT-2: `<|endoftext|>` (one token for both ends); SentencePiece:
  /// the model's bos, else its eos; tokenizer.json: hf_tokenizer.h. -1 when there is none.
  virtual int32_t bos_id() const = 0;
  /// The id padding positions hold (they are masked out of every loss and never attended to by
  /// a real token): the tokenizer's own pad token when it has one (SentencePiece's pad,
  /// tokenizer.json's hf_tokenizer.h), else eod_id(), else 0. GPT-2: `<|endoftext|>`.
  virtual int32_t pad_id() const = 0;
  /// Appends the ids of `text` to `out`. Ill-formed UTF-8 is repaired first (one U+FFFD per
  /// maximal ill-formed subpart, utf8.h), as the references see Python's errors="replace".
  virtual void encode(std::string_view text, std::vector<int32_t>& out) const = 0;
  std::vector<int32_t> encode(std::string_view text) const {
    std::vector<int32_t> out;
    encode(text, out);
    return out;
  }
  /// Text of the ids (bytes, for byte-level tokenizers: may end inside a UTF-8 character).
  /// Throws std::out_of_range naming an id outside the vocabulary.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  /// The text `ids` add after earlier text (generated tokens after a prompt): decode(ids) for
  /// byte-level tokenizers; SentencePiece keeps the word-initial space that decoding drops at
  /// the start of a text.
  virtual std::string decode_continuation(const std::vector<int32_t>& ids) const { return decode(ids); }
  /// e.g. "GPT-2 BPE (data/gpt2-vocab.json)", for messages.
  virtual std::string description() const = 0;
};

/// The token a new document's text follows in Loom's (and Megatron's) preprocessed data: the
/// end of the previous document, eod_id(), else bos_id() (-1: neither). Generation from an
/// empty prompt and lm-evaluation-harness's prefix token (empty contexts, rolling windows) use
/// it; for GPT-2 it is `<|endoftext|>`, the harness's own choice.
inline int32_t document_start_id(const Tokenizer& tokenizer) {
  return tokenizer.eod_id() >= 0 ? tokenizer.eod_id() : tokenizer.bos_id();
}

/// Which tokenizer, as the recipe's model.tokenizer section spells it (NeMo's keys):
/// library "megatron" + type "GPT2BPETokenizer" + vocab_file + merge_file; library
/// "sentencepiece" + model (a .model file); library "huggingface" + model (a tokenizer.json,
/// or a folder holding one; vocab_file naming a tokenizer.json is accepted too).
struct TokenizerSpec {
  std::string library = "megatron";
  std::string type = "GPT2BPETokenizer";
  std::string model, vocab_file, merge_file;
};

/// Loads the tokenizer. Throws DataError naming the file (and what in it) for a missing file,
/// one that does not parse, or a library/type Loom does not read.
std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerSpec& spec);

}  // namespace loom::data
