// What `loom convert` needs from a training run's recipe (<run_dir>/config.yaml): the model
// fields a checkpoint's metadata.json does not record and the tokenizer files.
#pragma once
#include <string>

#include "config/recipe.h"

namespace loom::convert {

/// <run_dir>/config.yaml, loaded. Throws ConvertInputError naming the file when the run has
/// none (`what` says what it is needed for) or it does not load.
config::Recipe load_run_recipe(const std::string& run_dir, const std::string& what);

/// A tokenizer path of the recipe: as written (relative to the working directory, as the
/// trainer read it), else relative to the run directory. Throws ConvertInputError naming the
/// recipe field when it is empty or names no file.
std::string resolve_run_file(const std::string& path, const std::string& run_dir, const std::string& field);

/// The recipe's GPT-2 vocab.json and merges.txt. Throws ConvertInputError naming
/// model.tokenizer.library when the run does not use the GPT-2 BPE tokenizer.
std::pair<std::string, std::string> gpt2_tokenizer_files(const config::Recipe& recipe, const std::string& run_dir);

}  // namespace loom::convert
