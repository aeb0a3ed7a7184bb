#include "data/tokenizer.h"

#include "data/data_error.h"
#include "data/gpt2_tokenizer.h"
#include "data/hf_tokenizer.h"
#include "data/sentencepiece_tokenizer.h"

namespace loom::data {

std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerSpec& spec) {
  if (spec.library == "megatron") {
    if (spec.type != "GPT2BPETokenizer")
      throw DataError("tokenizer: library megatron reads type GPT2BPETokenizer only, found '" + spec.type + "'");
    if (spec.vocab_file.empty() || spec.merge_file.empty())
      throw DataError("tokenizer: library megatron (GPT2BPETokenizer) needs vocab_file and merge_file");
    return std::make_unique<Gpt2Tokenizer>(spec.vocab_file, spec.merge_file);
  }
  if (spec.library == "sentencepiece") {
    if (spec.model.empty()) throw DataError("tokenizer: library sentencepiece needs model (the .model file)");
    return std::make_unique<SentencePieceTokenizer>(spec.model);
  }
  if (spec.library == "huggingface") {
    const std::string& file = spec.model.empty() ? spec.vocab_file : spec.model;
    if (file.empty()) throw DataError("tokenizer: library huggingface needs model (a tokenizer.json or its folder)");
    return std::make_unique<HfTokenizer>(file);
  }
  throw DataError("tokenizer: unknown library '" + spec.library + "', expected megatron, sentencepiece or huggingface");
}

}  // namespace loom::data
