// Every file in tests/config/malformed/ must fail to load with exactly the error lines its
// "# expect:" comments list (file:line:column, field path, expected vs found), in order.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "config_test_util.h"

using namespace loom::config;

namespace {

std::vector<std::string> expected_errors(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  std::string line;
  const std::string marker = "# expect: ";
  while (std::getline(in, line)) {
    if (line.rfind(marker, 0) != 0) continue;
    std::string text = line.substr(marker.size());
    const size_t at = text.find("{file}");
    if (at != std::string::npos) text.replace(at, 6, path);
    out.push_back(text);
  }
  return out;
}

}  // namespace

TEST_CASE("malformed recipes report located errors", "[config]") {
  const std::string dir = std::string(LOOM_SOURCE_DIR) + "/tests/config/malformed";
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".yaml") files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 12);
  for (const auto& file : files) {
    INFO(file);
    const auto want = expected_errors(file);
    REQUIRE_FALSE(want.empty());
    std::vector<std::string> got;
    try {
      load_recipe(file);
    } catch (const RecipeError& e) {
      got = e.errors;
      // what() carries every line, one per line.
      std::string joined;
      for (size_t i = 0; i < got.size(); ++i) joined += (i ? "\n" : "") + got[i];
      CHECK(std::string(e.what()) == joined);
    }
    CHECK(got == want);
  }
}

TEST_CASE("a missing recipe file is reported", "[config]") {
  try {
    load_recipe("/nonexistent/recipe.yaml");
    FAIL("expected RecipeError");
  } catch (const RecipeError& e) {
    REQUIRE(e.errors.size() == 1);
    CHECK(e.errors[0] == "/nonexistent/recipe.yaml: cannot open recipe file (No such file or directory)");
  }
}
