#include "data/corpus_inputs.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <string>

#include "data/data_error.h"
#include "data/string_suffix.h"
#include "data/input_stream.h"
#include "launch/file_util.h"

namespace loom::data {
namespace {

bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// Files under a directory, recursively; hidden entries and indexed-dataset outputs left out.
void walk(const std::string& dir, std::vector<std::string>& out) {
  for (const auto& name : launch::list_directory(dir)) {
    if (name.empty() || name[0] == '.') continue;
    const std::string path = dir + (ends_with(dir, "/") ? "" : "/") + name;
    struct stat st{};
    if (::stat(path.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) walk(path, out);
    else if (S_ISREG(st.st_mode) && !ends_with(name, ".idx") && !ends_with(name, ".bin")) out.push_back(path);
  }
}

int64_t parse_int(const std::string& s, const std::string& spec) {
  if (s.empty() || s.size() > 12 || s.find_first_not_of("0123456789") != std::string::npos)
    throw DataError("--partition '" + spec + "': expected I/N with integers 0 <= I < N (e.g. 3/8)");
  return std::stoll(s);
}

}  // namespace

std::vector<std::string> expand_inputs(const std::vector<std::string>& arguments) {
  if (arguments.empty()) throw DataError("preprocess: no --input given");
  std::vector<std::string> files;
  std::map<std::string, std::string> named_by;
  for (const auto& arg : arguments) {
    std::vector<std::string> found;
    struct stat st{};
    if (::stat(arg.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) {
        walk(arg, found);
        if (found.empty()) throw DataError("--input '" + arg + "': the directory holds no input files");
      } else {
        found.push_back(arg);
      }
    } else if (has_glob_chars(arg)) {
      glob_t g{};
      const int rc = ::glob(arg.c_str(), GLOB_ERR, nullptr, &g);
      if (rc == 0)
        for (size_t i = 0; i < g.gl_pathc; ++i) {
          struct stat fs{};
          if (::stat(g.gl_pathv[i], &fs) == 0 && S_ISREG(fs.st_mode)) found.emplace_back(g.gl_pathv[i]);
        }
      ::globfree(&g);
      if (found.empty()) throw DataError("--input '" + arg + "': the pattern matches no file");
    } else {
      throw DataError("--input '" + arg + "': no such file or directory");
    }
    std::sort(found.begin(), found.end());
    for (auto& f : found) {
      auto [it, fresh] = named_by.emplace(f, arg);
      if (!fresh)
        throw DataError("--input: file '" + f + "' is named twice (by '" + it->second + "' and '" + arg +
                        "'); each document must be tokenized once");
      files.push_back(std::move(f));
    }
  }
  return files;
}

Partition parse_partition(const std::string& spec) {
  const auto slash = spec.find('/');
  if (slash == std::string::npos)
    throw DataError("--partition '" + spec + "': expected I/N with integers 0 <= I < N (e.g. 3/8)");
  Partition p;
  p.index = parse_int(spec.substr(0, slash), spec);
  p.count = parse_int(spec.substr(slash + 1), spec);
  if (p.count < 1 || p.index >= p.count)
    throw DataError("--partition '" + spec + "': expected 0 <= I < N with N >= 1, found I = " +
                    std::to_string(p.index) + ", N = " + std::to_string(p.count) + " (partitions are numbered from 0)");
  return p;
}

PartitionShare partition_share(const std::vector<std::string>& files, const Partition& p,
                               const std::function<int64_t(const std::vector<std::string>&)>& total_bytes) {
  PartitionShare s;
  const auto n = static_cast<int64_t>(files.size());
  if (n >= p.count) {
    const int64_t lo = p.index * n / p.count, hi = (p.index + 1) * n / p.count;
    s.files.assign(files.begin() + lo, files.begin() + hi);
    return s;
  }
  s.files = files;
  s.by_documents = true;
  const int64_t b = total_bytes(files);
  // Products kept in 128 bits: B may be many GB and N large.
  s.first_byte = static_cast<int64_t>(static_cast<__int128>(p.index) * b / p.count);
  s.end_byte = static_cast<int64_t>(static_cast<__int128>(p.index + 1) * b / p.count);
  return s;
}

int64_t decompressed_bytes(const std::vector<std::string>& files, int64_t max_line_bytes) {
  int64_t total = 0;
  for (const auto& f : files) {
    if (input_kind(f).compression == Compression::kNone) {
      struct stat st{};
      if (::stat(f.c_str(), &st) != 0) throw DataError("input '" + f + "': cannot stat");
      total += static_cast<int64_t>(st.st_size);
      continue;
    }
    LineStream in(f, max_line_bytes);
    std::string line;
    while (in.next_line(line)) {
    }
    total += in.bytes_out();
  }
  return total;
}

}  // namespace loom::data
