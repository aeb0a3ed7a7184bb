#include "convert/run_recipe.h"

#include <filesystem>

#include "config/schema.h"
#include "convert/convert_error.h"

namespace fs = std::filesystem;

namespace loom::convert {

config::Recipe load_run_recipe(const std::string& run_dir, const std::string& what) {
  const fs::path file = run_dir.empty() ? fs::path() : fs::path(run_dir) / "config.yaml";
  if (run_dir.empty() || !fs::exists(file))
    throw ConvertInputError("the checkpoint is not inside a run directory with a config.yaml, which " + what +
                            " needs: pass the run directory (or its checkpoints/ folder)");
  try {
    return config::load_recipe(file.string());
  } catch (const std::exception& e) {
    throw ConvertInputError("cannot read the run's recipe " + file.string() + ":\n" + e.what());
  }
}

std::string resolve_run_file(const std::string& path, const std::string& run_dir, const std::string& field) {
  const std::string recipe = (fs::path(run_dir) / "config.yaml").string();
  if (path.empty()) throw ConvertInputError(recipe + ": " + field + " is empty");
  if (fs::is_regular_file(path)) return path;
  if (fs::path(path).is_relative() && fs::is_regular_file(fs::path(run_dir) / path)) return (fs::path(run_dir) / path).string();
  throw ConvertInputError(recipe + ": " + field + " '" + path + "' does not exist (relative to the working directory or " +
                          run_dir + ")");
}

std::pair<std::string, std::string> gpt2_tokenizer_files(const config::Recipe& recipe, const std::string& run_dir) {
  if (recipe.model.tokenizer.library != config::TokenizerLibrary::kMegatron)
    throw ConvertInputError((fs::path(run_dir) / "config.yaml").string() + ": model.tokenizer.library is " +
                            config::detail::enum_name(recipe.model.tokenizer.library) +
                            "; the Hugging Face GPT-2 export carries the GPT-2 BPE tokenizer (library megatron, "
                            "vocab_file and merge_file)");
  return {resolve_run_file(recipe.model.tokenizer.vocab_file, run_dir, "model.tokenizer.vocab_file"),
          resolve_run_file(recipe.model.tokenizer.merge_file, run_dir, "model.tokenizer.merge_file")};
}

}  // namespace loom::convert
