// Shared helpers of the loom_data tests: source-tree paths, temporary folders, small file I/O.
#pragma once
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace loom::data::test {

inline std::string source_path(const std::string& rel) { return std::string(LOOM_SOURCE_DIR) + "/" + rel; }
inline std::string vocab_file() { return source_path("data/gpt2-vocab.json"); }
inline std::string merges_file() { return source_path("data/gpt2-merges.txt"); }
inline std::string golden(const std::string& rel) { return source_path("tests/data/golden/" + rel); }

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("test: cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

inline std::vector<int32_t> read_ids(const std::string& path) {
  std::istringstream in(read_bytes(path));
  std::vector<int32_t> ids;
  int32_t x;
  while (in >> x) ids.push_back(x);
  return ids;
}

/// A fresh temporary directory, removed when the object goes away.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/loom_data_test_XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

}  // namespace loom::data::test
