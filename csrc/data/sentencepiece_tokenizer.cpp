#include "data/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <stdexcept>

#include "data/data_error.h"
#include "data/utf8.h"

namespace loom::data {

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_path)
    : path_(model_path), sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  const auto status = sp_->Load(model_path);
  if (!status.ok())
    throw DataError("SentencePiece model '" + model_path + "': cannot load: " + status.ToString());
  // An anchor for decode_continuation: a normal piece that does not begin with U+2581.
  static const std::string kWordStart = "\xe2\x96\x81";
  for (int id = 0; id < sp_->GetPieceSize(); ++id) {
    if (sp_->IsControl(id) || sp_->IsUnknown(id) || sp_->IsUnused(id) || sp_->IsByte(id)) continue;
    if (sp_->IdToPiece(id).rfind(kWordStart, 0) == 0) continue;
    anchor_text_ = decode({id});
    if (anchor_text_.empty()) continue;
    anchor_id_ = id;
    break;
  }
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

size_t SentencePieceTokenizer::vocab_size() const { return static_cast<size_t>(sp_->GetPieceSize()); }

int32_t SentencePieceTokenizer::eod_id() const { return sp_->eos_id(); }

int32_t SentencePieceTokenizer::bos_id() const { return sp_->bos_id() >= 0 ? sp_->bos_id() : sp_->eos_id(); }

int32_t SentencePieceTokenizer::pad_id() const {
  if (sp_->pad_id() >= 0) return sp_->pad_id();
  return sp_->eos_id() >= 0 ? sp_->eos_id() : 0;
}

void SentencePieceTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  std::string repaired;
  if (utf8_valid_prefix(text) != text.size()) {
    repaired = utf8_replace_invalid(text);
    text = repaired;
  }
  std::vector<int> ids;
  const auto status = sp_->Encode(absl::string_view(text.data(), text.size()), &ids);
  if (!status.ok()) throw std::runtime_error("SentencePiece '" + path_ + "': encode failed: " + status.ToString());
  out.insert(out.end(), ids.begin(), ids.end());
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  const int n = sp_->GetPieceSize();
  for (int32_t id : ids)
    if (id < 0 || id >= n)
      throw std::out_of_range("SentencePiece '" + path_ + "': token id " + std::to_string(id) +
                              " is not in the vocabulary (size " + std::to_string(n) + ")");
  std::string text;
  const auto status = sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  if (!status.ok()) throw std::runtime_error("SentencePiece '" + path_ + "': decode failed: " + status.ToString());
  return text;
}

std::string SentencePieceTokenizer::decode_continuation(const std::vector<int32_t>& ids) const {
  if (ids.empty() || anchor_id_ < 0) return decode(ids);
  std::vector<int32_t> anchored{anchor_id_};
  anchored.insert(anchored.end(), ids.begin(), ids.end());
  const std::string text = decode(anchored);
  if (text.compare(0, anchor_text_.size(), anchor_text_) != 0) return decode(ids);
  return text.substr(anchor_text_.size());
}

}  // namespace loom::data
