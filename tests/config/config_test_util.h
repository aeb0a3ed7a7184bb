// Shared helpers for the loom_config tests.
#pragma once

#include <string>
#include <vector>

#include "config/recipe.h"

namespace loom::config::test {

/// <repo>/recipes/<name>
inline std::string recipe_file(const std::string& name) { return std::string(LOOM_SOURCE_DIR) + "/recipes/" + name; }
/// <repo>/tests/config/malformed/<name>
inline std::string malformed_file(const std::string& name) {
  return std::string(LOOM_SOURCE_DIR) + "/tests/config/malformed/" + name;
}

/// A small valid recipe: 4 CPU ranks, t=2 p=2 d=1, everything else defaulted.
inline const char* kMinimalRecipe = R"(trainer:
  devices: 4
  accelerator: cpu
  precision: 32
  max_steps: 10
model:
  micro_batch_size: 2
  global_batch_size: 8
  tensor_model_parallel_size: 2
  pipeline_model_parallel_size: 2
  encoder_seq_length: 128
  num_layers: 4
  hidden_size: 128
  num_attention_heads: 4
  data:
    data_prefix: data/x_text_document
  tokenizer:
    vocab_file: data/gpt2-vocab.json
    merge_file: data/gpt2-merges.txt
  optim:
    lr: 1.0e-3
)";

/// The error lines of loading `yaml` (empty if it loads).
inline std::vector<std::string> errors_of(const std::string& yaml, const std::vector<std::string>& overrides = {},
                                          const std::string& origin = "t.yaml") {
  try {
    load_recipe_from_string(yaml, origin, overrides);
  } catch (const RecipeError& e) {
    return e.errors;
  }
  return {};
}

}  // namespace loom::config::test
