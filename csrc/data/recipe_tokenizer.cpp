#include "data/recipe_tokenizer.h"

namespace loom::data {

TokenizerSpec tokenizer_spec(const config::TokenizerConfig& t) {
  TokenizerSpec s;
  switch (t.library) {
    case config::TokenizerLibrary::kMegatron: s.library = "megatron"; break;
    case config::TokenizerLibrary::kSentencePiece: s.library = "sentencepiece"; break;
    case config::TokenizerLibrary::kHuggingFace: s.library = "huggingface"; break;
  }
  s.type = t.type.value_or(s.library == "megatron" ? "GPT2BPETokenizer" : "");
  s.model = t.model.value_or("");
  s.vocab_file = t.vocab_file;
  s.merge_file = t.merge_file;
  return s;
}

config::TokenizerConfig tokenizer_config(const TokenizerSpec& s) {
  config::TokenizerConfig t;
  if (s.library == "sentencepiece") t.library = config::TokenizerLibrary::kSentencePiece;
  if (s.library == "huggingface") t.library = config::TokenizerLibrary::kHuggingFace;
  t.type = s.type.empty() ? std::nullopt : std::optional<std::string>(s.type);
  t.model = s.model.empty() ? std::nullopt : std::optional<std::string>(s.model);
  t.vocab_file = s.vocab_file;
  t.merge_file = s.merge_file;
  return t;
}

std::unique_ptr<Tokenizer> recipe_tokenizer(const config::TokenizerConfig& t) { return make_tokenizer(tokenizer_spec(t)); }

int64_t recipe_vocab_size(const config::TokenizerConfig& t) {
  return static_cast<int64_t>(recipe_tokenizer(t)->vocab_size());
}

}  // namespace loom::data
