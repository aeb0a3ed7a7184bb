// A SentencePiece model (the .model files NeMo's multilingual GPT models use), through the
// sentencepiece library: ids equal `sentencepiece.SentencePieceProcessor(model_file=...)
// .encode(text)` (what NeMo's SentencePieceTokenizer.text_to_ids and Megatron's
// GPTSentencePieceTokenizer call). The end-of-document id is the model's eos (-1 if disabled).
#pragma once
#include <memory>
#include <string>

#include "data/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace loom::data {

class SentencePieceTokenizer : public Tokenizer {
 public:
  /// Throws DataError naming the file when it is missing or not a SentencePiece model.
  explicit SentencePieceTokenizer(const std::string& model_path);
  ~SentencePieceTokenizer() override;

  size_t vocab_size() const override;
  int32_t eod_id() const override;
  int32_t bos_id() const override;  ///< the model's bos, else its eos (-1: neither)
  int32_t pad_id() const override;  ///< the model's pad, else its eos, else 0
  void encode(std::string_view text, std::vector<int32_t>& out) const override;
  using Tokenizer::encode;
  std::string decode(const std::vector<int32_t>& ids) const override;
  /// The text `ids` add after a known piece (decode(anchor + ids) less decode(anchor)): the
  /// word-initial space of the first piece ("▁...") stays, which SentencePiece removes at the
  /// start of a text (its dummy prefix).
  std::string decode_continuation(const std::vector<int32_t>& ids) const override;
  std::string description() const override { return "SentencePiece ('" + path_ + "')"; }

 private:
  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  int32_t anchor_id_ = -1;   // a normal piece that does not start a word (-1: none found)
  std::string anchor_text_;  // its decoding
};

}  // namespace loom::data
