// check_input_files(): missing tokenizer and dataset files are reported with their locations.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "config_test_util.h"

using namespace loom::config;
using loom::config::test::kMinimalRecipe;

TEST_CASE("input files are checked relative to the working directory", "[config]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("loom_config_inputs_" + std::to_string(::getpid()));
  fs::create_directories(dir / "data");
  const fs::path old_cwd = fs::current_path();
  fs::current_path(dir);
  const Recipe r = load_recipe_from_string(kMinimalRecipe, "min.yaml");
  try {
    check_input_files(r);
    FAIL("expected RecipeError");
  } catch (const RecipeError& e) {
    const std::string rel = " (relative to the working directory " + dir.string() + ")";
    const std::vector<std::string> want = {
        "min.yaml:18:17: model.tokenizer.vocab_file: expected an existing GPT-2 vocab file, found "
        "\"data/gpt2-vocab.json\"" + rel,
        "min.yaml:19:17: model.tokenizer.merge_file: expected an existing GPT-2 merges file, found "
        "\"data/gpt2-merges.txt\"" + rel,
        "min.yaml:16:18: model.data.data_prefix: expected an existing indexed dataset file, found "
        "\"data/x_text_document.bin\"" + rel,
        "min.yaml:16:18: model.data.data_prefix: expected an existing indexed dataset index, found "
        "\"data/x_text_document.idx\"" + rel};
    CHECK(e.errors == want);
  }
  for (const char* f : {"data/gpt2-vocab.json", "data/gpt2-merges.txt", "data/x_text_document.bin",
                        "data/x_text_document.idx"}) {
    std::ofstream(dir / f) << "x";
  }
  CHECK_NOTHROW(check_input_files(r));
  fs::current_path(old_cwd);
  fs::remove_all(dir);
}
