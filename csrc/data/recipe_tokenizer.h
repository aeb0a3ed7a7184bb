// The tokenizer a recipe's model.tokenizer section names (NeMo's keys, config/recipe.h), for
// training (the model's vocabulary follows its size) and any command that reads a recipe.
#pragma once
#include <cstdint>
#include <memory>

#include "config/recipe.h"
#include "data/tokenizer.h"

namespace loom::data {

/// library/type/model/vocab_file/merge_file as a TokenizerSpec (docs/design/tokenizers.md).
TokenizerSpec tokenizer_spec(const config::TokenizerConfig& tokenizer);
/// The reverse: a TokenizerSpec as the recipe section spells it (an unknown library stays megatron).
config::TokenizerConfig tokenizer_config(const TokenizerSpec& spec);
/// Loads it (make_tokenizer; DataError naming the file when it does not load).
std::unique_ptr<Tokenizer> recipe_tokenizer(const config::TokenizerConfig& tokenizer);
/// Its vocab_size(): the real (unpadded) vocabulary of a model trained with it.
int64_t recipe_vocab_size(const config::TokenizerConfig& tokenizer);

}  // namespace loom::data
