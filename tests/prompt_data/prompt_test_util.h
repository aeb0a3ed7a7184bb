// Shared helpers of the loom_prompt_data tests: the GPT-2 tokenizer, task templates in one
// line, temporary folders and files.
#pragma once
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "config/recipe.h"
#include "data/gpt2_tokenizer.h"

namespace loom::prompt_data::test {

inline const data::Gpt2Tokenizer& gpt2() {
  static data::Gpt2Tokenizer tok(std::string(LOOM_SOURCE_DIR) + "/data/gpt2-vocab.json",
                                 std::string(LOOM_SOURCE_DIR) + "/data/gpt2-merges.txt");
  return tok;
}

/// GPT-2 ids of `text` as int64.
inline std::vector<int64_t> ids(const std::string& text) {
  const auto v = gpt2().encode(text);
  return std::vector<int64_t>(v.begin(), v.end());
}

/// Concatenation of id lists.
inline std::vector<int64_t> cat(std::initializer_list<std::vector<int64_t>> parts) {
  std::vector<int64_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

inline std::vector<int64_t> repeat(int64_t id, int64_t n) { return std::vector<int64_t>(static_cast<size_t>(n), id); }

/// A task template; total_virtual_tokens is the sum of the splits.
inline config::TaskTemplate task(const std::string& name, const std::string& prompt_template,
                                 std::vector<std::string> fields, std::vector<int64_t> splits,
                                 std::optional<std::string> answer_field = std::nullopt, bool answer_only_loss = false,
                                 std::optional<std::string> truncate_field = std::nullopt) {
  config::TaskTemplate t;
  t.taskname = name;
  t.prompt_template = prompt_template;
  t.prompt_template_fields = std::move(fields);
  t.total_virtual_tokens = std::accumulate(splits.begin(), splits.end(), int64_t{0});
  t.virtual_token_splits = std::move(splits);
  t.answer_field = std::move(answer_field);
  t.answer_only_loss = answer_only_loss;
  t.truncate_field = std::move(truncate_field);
  return t;
}

/// A fresh temporary directory, removed when the object goes away.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/loom_prompt_data_test_XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  /// Writes `text` to file `name` and returns its path.
  std::string write(const std::string& name, const std::string& text) const {
    const std::string p = path + "/" + name;
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
};

constexpr int64_t kEod = 50256;

}  // namespace loom::prompt_data::test
