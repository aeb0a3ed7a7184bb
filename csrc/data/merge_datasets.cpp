#include "data/merge_datasets.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>

#include "data/data_error.h"
#include "data/string_suffix.h"
#include "data/indexed_dataset.h"
#include "launch/file_util.h"

namespace loom::data {
namespace {

bool is_file(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Same file (device + inode), so an output cannot overwrite an input through another spelling.
bool same_file(const std::string& a, const std::string& b) {
  struct stat sa{}, sb{};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

void append_file(std::FILE* out, const std::string& path, const std::string& out_path) {
  std::FILE* in = std::fopen(path.c_str(), "rb");
  if (!in) throw DataError("merge: cannot open '" + path + "': " + std::strerror(errno));
  std::vector<char> buf(size_t{8} << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), in)) > 0)
    if (std::fwrite(buf.data(), 1, n, out) != n) {
      std::fclose(in);
      throw std::runtime_error("merge: cannot write '" + out_path + "': " + std::strerror(errno));
    }
  const bool failed = std::ferror(in);
  std::fclose(in);
  if (failed) throw std::runtime_error("merge: read error on '" + path + "'");
}

}  // namespace

std::vector<std::string> datasets_in_directory(const std::string& directory) {
  std::vector<std::string> prefixes;
  const std::string dir = ends_with(directory, "/") ? directory : directory + "/";
  for (const auto& name : launch::list_directory(directory)) {
    if (!ends_with(name, ".idx")) continue;
    const std::string prefix = dir + name.substr(0, name.size() - 4);
    if (!is_file(bin_path(prefix)))
      throw DataError("merge: '" + idx_path(prefix) + "' has no '" + bin_path(prefix) + "' beside it");
    prefixes.push_back(prefix);
  }
  if (prefixes.empty()) throw DataError("merge: directory '" + directory + "' holds no .idx/.bin pairs");
  return prefixes;
}

MergeResult merge_datasets(const std::vector<std::string>& prefixes, const std::string& output_prefix) {
  if (prefixes.empty()) throw DataError("merge: no input datasets");
  for (const auto& p : prefixes)
    for (auto path : {bin_path, idx_path})
      if (path(p) == path(output_prefix) || same_file(path(p), path(output_prefix)))
        throw DataError("merge: the output '" + path(output_prefix) + "' is also an input");
  const std::string temp = output_prefix + ".partial-" + std::to_string(::getpid());
  std::vector<int32_t> lengths;
  std::vector<int64_t> doc_indices{0};
  MergeResult r;
  std::FILE* bin = std::fopen(bin_path(temp).c_str(), "wb");
  if (!bin) throw std::runtime_error("merge: cannot create '" + bin_path(temp) + "': " + std::strerror(errno));
  auto cleanup = [&] {
    if (bin) std::fclose(bin);
    bin = nullptr;
    std::remove(bin_path(temp).c_str());
    std::remove(idx_path(temp).c_str());
  };
  try {
    std::optional<DType> dtype;
    for (const auto& p : prefixes) {
      const IndexedDataset ds(p);  // validates index and .bin
      if (dtype && ds.dtype() != *dtype)
        throw DataError("merge: '" + idx_path(p) + "' holds " + dtype_name(ds.dtype()) + " tokens, the earlier inputs " +
                        dtype_name(*dtype) + " (every input must come from the same tokenizer)");
      dtype = ds.dtype();
      const auto offset = static_cast<int64_t>(lengths.size());
      const auto seq_lengths = ds.sequence_lengths();
      for (size_t i = 0; i < ds.num_sequences(); ++i) lengths.push_back(seq_lengths[i]);
      const auto docs = ds.document_indices();
      for (size_t i = 1; i < ds.num_document_indices(); ++i) doc_indices.push_back(offset + docs[i]);
      // The sequences' bytes, exactly: what the index points at (not any trailing bytes).
      const int64_t used = ds.num_tokens() * static_cast<int64_t>(dtype_size(ds.dtype()));
      struct stat st{};
      ::stat(bin_path(p).c_str(), &st);
      if (st.st_size != used)
        throw DataError("merge: '" + bin_path(p) + "' has " + std::to_string(st.st_size) + " bytes, its index describes " +
                        std::to_string(used));
      append_file(bin, bin_path(p), bin_path(temp));
      r.bytes += used;
    }
    if (std::fclose(bin) != 0) {
      bin = nullptr;
      throw std::runtime_error("merge: cannot close '" + bin_path(temp) + "'");
    }
    bin = nullptr;
    IndexedDatasetWriter::write_index(idx_path(temp), *dtype, lengths, doc_indices);
    for (auto path : {bin_path, idx_path})
      if (std::rename(path(temp).c_str(), path(output_prefix).c_str()) != 0)
        throw std::runtime_error("merge: cannot rename '" + path(temp) + "' to '" + path(output_prefix) + "'");
  } catch (...) {
    cleanup();
    throw;
  }
  r.sequences = static_cast<int64_t>(lengths.size());
  r.documents = static_cast<int64_t>(doc_indices.size()) - 1;
  return r;
}

}  // namespace loom::data
