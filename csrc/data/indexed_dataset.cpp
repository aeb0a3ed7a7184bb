#include "data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "data/data_error.h"

namespace loom::data {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeaderSize = 34;

template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

std::string sys_error(const std::string& what, const std::string& path) {
  return what + " '" + path + "': " + std::strerror(errno);
}

}  // namespace

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kUInt8: case DType::kInt8: return 1;
    case DType::kInt16: case DType::kUInt16: return 2;
    case DType::kInt32: case DType::kFloat32: return 4;
    case DType::kInt64: case DType::kFloat64: return 8;
  }
  throw std::invalid_argument("unknown dtype code " + std::to_string(static_cast<int>(t)));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kUInt8: return "uint8";
    case DType::kInt8: return "int8";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kFloat64: return "float64";
    case DType::kFloat32: return "float32";
    case DType::kUInt16: return "uint16";
  }
  return "unknown";
}

bool valid_dtype_code(uint8_t code) { return code >= 1 && code <= 8; }

DType token_dtype_for_vocab(size_t vocab_size) { return vocab_size < 65500 ? DType::kUInt16 : DType::kInt32; }

std::string idx_path(const std::string& prefix) { return prefix + ".idx"; }
std::string bin_path(const std::string& prefix) { return prefix + ".bin"; }

// A read-only mmap of a whole file (an empty file maps to nothing).
struct IndexedDataset::Mapping {
  const uint8_t* data = nullptr;
  size_t size = 0;
  explicit Mapping(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw DataError(sys_error("cannot open", path));
    struct stat st{};
    if (::fstat(fd, &st) != 0) {
      ::close(fd);
      throw std::runtime_error(sys_error("cannot stat", path));
    }
    size = static_cast<size_t>(st.st_size);
    if (size > 0) {
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        throw std::runtime_error(sys_error("cannot mmap", path));
      }
      data = static_cast<const uint8_t*>(p);
    }
    ::close(fd);
  }
  ~Mapping() {
    if (data) ::munmap(const_cast<uint8_t*>(data), size);
  }
};

IndexedDataset::IndexedDataset(const std::string& prefix, bool open_bin) : prefix_(prefix) {
  const std::string ipath = idx_path(prefix);
  idx_map_ = std::make_unique<Mapping>(ipath);
  const uint8_t* p = idx_map_->data;
  const size_t size = idx_map_->size;
  auto bad = [&](const std::string& what) { return DataError("index file '" + ipath + "': " + what); };
  if (size < kHeaderSize)
    throw bad("truncated: " + std::to_string(size) + " bytes, a header needs " + std::to_string(kHeaderSize));
  if (std::memcmp(p, kMagic, 9) != 0) throw bad("bad magic: expected \"MMIDIDX\\0\\0\" (Megatron indexed dataset)");
  const auto version = load<uint64_t>(p + 9);
  if (version != 1) throw bad("unsupported version " + std::to_string(version) + ", expected 1");
  const uint8_t code = p[17];
  if (!valid_dtype_code(code)) throw bad("unknown dtype code " + std::to_string(code) + ", expected 1..8");
  dtype_ = static_cast<DType>(code);
  const auto n = load<uint64_t>(p + 18);
  const auto d = load<uint64_t>(p + 26);
  // 12 bytes per sequence + 8 per document index; compare without overflowing.
  const uint64_t room = size - kHeaderSize;
  if (n > room / 12 || d > (room - 12 * n) / 8)
    throw bad("truncated: header declares " + std::to_string(n) + " sequences and " + std::to_string(d) +
              " document indices, needing " + std::to_string(kHeaderSize) + " + 12*" + std::to_string(n) + " + 8*" +
              std::to_string(d) + " bytes, file has " + std::to_string(size));
  if (d < 1) throw bad("document count is 0, expected at least 1 (document indices start with 0)");
  num_sequences_ = n;
  num_doc_indices_ = d;
  // The arrays are at offsets 34, 34+4N, 34+12N: not aligned for their types, so they are read
  // element by element (unaligned_array.h), as numpy.frombuffer reads them.
  lengths_ = UnalignedArray<int32_t>::at(p + kHeaderSize);
  pointers_ = UnalignedArray<int64_t>::at(p + kHeaderSize + 4 * n);
  doc_indices_ = UnalignedArray<int64_t>::at(p + kHeaderSize + 12 * n);

  if (doc_indices_[0] != 0) throw bad("document_indices[0] = " + std::to_string(doc_indices_[0]) + ", expected 0");
  if (doc_indices_[d - 1] != static_cast<int64_t>(n))
    throw bad("last document index = " + std::to_string(doc_indices_[d - 1]) + ", expected the sequence count " +
              std::to_string(n));
  for (size_t i = 1; i < d; ++i)
    if (doc_indices_[i] < doc_indices_[i - 1])
      throw bad("document_indices decrease at " + std::to_string(i) + ": " + std::to_string(doc_indices_[i - 1]) +
                " then " + std::to_string(doc_indices_[i]));
  const auto esize = static_cast<int64_t>(dtype_size(dtype_));
  for (size_t i = 0; i < n; ++i) {
    if (lengths_[i] < 0) throw bad("sequence " + std::to_string(i) + " has negative length " + std::to_string(lengths_[i]));
    if (pointers_[i] < 0 || pointers_[i] > (INT64_MAX - int64_t{lengths_[i]} * esize))
      throw bad("sequence " + std::to_string(i) + " has invalid byte pointer " + std::to_string(pointers_[i]));
  }
  if (open_bin) {
    const std::string bpath = bin_path(prefix);
    bin_map_ = std::make_unique<Mapping>(bpath);
    const auto bsize = static_cast<int64_t>(bin_map_->size);
    // Megatron writes each pointer as the running sum of length x element size: pointers that
    // advance by another element size, or a .bin of exactly another size per token, mean the
    // dtype code does not describe the data (reading it would reinterpret the bytes).
    const int written_size = pointer_element_size();
    const int64_t tokens = num_tokens();
    int bin_size_per_token = 0;
    for (int k : {1, 2, 4, 8}) {
      int64_t bytes = 0;
      if (tokens > 0 && !__builtin_mul_overflow(tokens, int64_t{k}, &bytes) && bsize == bytes) bin_size_per_token = k;
    }
    const int disagreeing = written_size > 0 && written_size != esize                               ? written_size
                            : written_size <= 0 && bin_size_per_token > 0 && bin_size_per_token != esize ? bin_size_per_token
                                                                                                          : 0;
    if (disagreeing)
      throw bad("dtype code " + std::to_string(code) + " (" + dtype_name(dtype_) + ", " + std::to_string(esize) +
                " bytes per token) disagrees with the data: " +
                (written_size > 0 ? "the sequence pointers advance " + std::to_string(written_size) + " bytes per token"
                                  : "'" + bpath + "' holds " + std::to_string(bsize) + " bytes for " +
                                        std::to_string(tokens) + " tokens") +
                " (" + std::to_string(disagreeing) + " bytes per token); was the dtype byte changed?");
    for (size_t i = 0; i < n; ++i) {
      const int64_t end = pointers_[i] + int64_t{lengths_[i]} * esize;
      if (end > bsize)
        throw DataError("data file '" + bpath + "': truncated: sequence " + std::to_string(i) + " ends at byte " +
                        std::to_string(end) + " (per '" + ipath + "'), file has " + std::to_string(bsize) + " bytes");
    }
  }
}

int IndexedDataset::pointer_element_size() const {
  // The element size k for which pointer[i] = pointer[0] + k * (tokens before i) for every i.
  int found = 0;
  for (int k : {1, 2, 4, 8}) {
    int64_t expected = num_sequences_ > 0 ? pointers_[0] : 0;
    bool all = true, informative = false;
    for (size_t i = 0; i < num_sequences_ && all; ++i) {
      all = pointers_[i] == expected;
      if (i > 0 && lengths_[i - 1] > 0) informative = true;
      if (__builtin_add_overflow(expected, int64_t{lengths_[i]} * k, &expected)) all = false;
    }
    if (!all || !informative) continue;
    if (found) return -1;  // cannot happen with a non-empty preceding sequence; stay safe
    found = k;
  }
  return found;
}

IndexedDataset::~IndexedDataset() = default;

int64_t IndexedDataset::num_tokens() const {
  int64_t total = 0;
  for (size_t i = 0; i < num_sequences_; ++i) total += lengths_[i];
  return total;
}

void IndexedDataset::read(size_t seq, size_t offset, std::optional<size_t> length, std::vector<int64_t>& out) const {
  if (!bin_map_) throw std::logic_error("indexed dataset '" + prefix_ + "': opened without its .bin, cannot read tokens");
  if (seq >= num_sequences_)
    throw std::out_of_range("indexed dataset '" + prefix_ + "': sequence " + std::to_string(seq) + " out of range (" +
                            std::to_string(num_sequences_) + " sequences)");
  const auto len = static_cast<size_t>(lengths_[seq]);
  const size_t count = length ? *length : (offset <= len ? len - offset : 0);
  if (offset > len || count > len - offset)
    throw std::out_of_range("indexed dataset '" + prefix_ + "': tokens [" + std::to_string(offset) + ", " +
                            std::to_string(offset + count) + ") outside sequence " + std::to_string(seq) +
                            " of length " + std::to_string(len));
  const size_t es = dtype_size(dtype_);
  const uint8_t* src = bin_map_->data + pointers_[seq] + offset * es;
  const size_t base = out.size();
  out.resize(base + count);
  int64_t* dst = out.data() + base;
  switch (dtype_) {
#define LOOM_CASE(K, T) \
  case DType::K: for (size_t i = 0; i < count; ++i) dst[i] = static_cast<int64_t>(load<T>(src + i * sizeof(T))); break;
    LOOM_CASE(kUInt8, uint8_t)
    LOOM_CASE(kInt8, int8_t)
    LOOM_CASE(kInt16, int16_t)
    LOOM_CASE(kUInt16, uint16_t)
    LOOM_CASE(kInt32, int32_t)
    LOOM_CASE(kInt64, int64_t)
#undef LOOM_CASE
    case DType::kFloat32:
    case DType::kFloat64:
      for (size_t i = 0; i < count; ++i) {
        const double v = dtype_ == DType::kFloat32 ? load<float>(src + i * 4) : load<double>(src + i * 8);
        // A float outside int64's range has no integer value (converting it is undefined).
        if (!(v >= -9.2e18 && v <= 9.2e18))
          throw DataError("data file '" + bin_path(prefix_) + "': sequence " + std::to_string(seq) + " position " +
                          std::to_string(offset + i) + " holds " + std::to_string(v) + ", not a token id");
        dst[i] = static_cast<int64_t>(v);
      }
      break;
  }
}

std::vector<int64_t> IndexedDataset::read(size_t seq) const {
  std::vector<int64_t> out;
  read(seq, 0, std::nullopt, out);
  return out;
}

void IndexedDataset::check_token_range(int64_t vocab_size) const {
  const bool is_float = dtype_ == DType::kFloat32 || dtype_ == DType::kFloat64;
  std::vector<int64_t> buf;
  for (size_t s = 0; s < num_sequences_; ++s) {
    if (is_float) {
      const size_t es = dtype_size(dtype_);
      for (int32_t i = 0; i < lengths_[s]; ++i) {
        const double v = dtype_ == DType::kFloat32 ? load<float>(bin_map_->data + pointers_[s] + i * es)
                                                  : load<double>(bin_map_->data + pointers_[s] + i * es);
        if (!(v >= 0 && v < static_cast<double>(vocab_size)) || std::floor(v) != v)
          throw DataError("data file '" + bin_path(prefix_) + "': sequence " + std::to_string(s) + " position " +
                          std::to_string(i) + " holds " + std::to_string(v) + ", not a token id in [0, " +
                          std::to_string(vocab_size) + ")");
      }
      continue;
    }
    buf.clear();
    read(s, 0, std::nullopt, buf);
    for (size_t i = 0; i < buf.size(); ++i)
      if (buf[i] < 0 || buf[i] >= vocab_size)
        throw DataError("data file '" + bin_path(prefix_) + "': sequence " + std::to_string(s) + " position " +
                        std::to_string(i) + " holds token id " + std::to_string(buf[i]) + ", outside the vocabulary [0, " +
                        std::to_string(vocab_size) + ")" +
                        (buf[i] < 0 ? std::string(" (the .idx declares the signed dtype ") + dtype_name(dtype_) +
                                          ": was the dtype byte changed from an unsigned one?)"
                                    : std::string()));
  }
}

// ---------------------------------------------------------------------------------------------

IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix, DType dtype) : prefix_(prefix), dtype_(dtype) {
  if (dtype == DType::kFloat32 || dtype == DType::kFloat64)
    throw DataError("indexed dataset writer '" + prefix + "': token dtype must be an integer type, got " + dtype_name(dtype));
  bin_ = std::fopen(bin_path(prefix).c_str(), "wb");
  if (!bin_) throw std::runtime_error(sys_error("cannot create", bin_path(prefix)));
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (!finalized_) {
    try {
      finalize();
    } catch (...) {
    }
  }
}

void IndexedDatasetWriter::add_document(const std::vector<int32_t>& tokens, const std::vector<int32_t>& sequence_lengths) {
  if (finalized_) throw std::logic_error("indexed dataset writer '" + prefix_ + "': add_document after finalize");
  int64_t lo = 0, hi = 0;
  switch (dtype_) {
    case DType::kUInt8: hi = 255; break;
    case DType::kInt8: lo = -128; hi = 127; break;
    case DType::kInt16: lo = -32768; hi = 32767; break;
    case DType::kUInt16: hi = 65535; break;
    default: lo = INT32_MIN; hi = INT32_MAX; break;
  }
  const size_t es = dtype_size(dtype_);
  buffer_.resize(tokens.size() * es);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t v = tokens[i];
    if (v < lo || v > hi)
      throw DataError("indexed dataset writer '" + prefix_ + "': token " + std::to_string(v) + " does not fit dtype " +
                      dtype_name(dtype_));
    char* dst = buffer_.data() + i * es;
    switch (dtype_) {
      case DType::kUInt8: case DType::kInt8: { auto x = static_cast<uint8_t>(v); std::memcpy(dst, &x, 1); break; }
      case DType::kInt16: case DType::kUInt16: { auto x = static_cast<uint16_t>(v); std::memcpy(dst, &x, 2); break; }
      case DType::kInt32: { auto x = static_cast<int32_t>(v); std::memcpy(dst, &x, 4); break; }
      default: { std::memcpy(dst, &v, 8); break; }
    }
  }
  if (!buffer_.empty() && std::fwrite(buffer_.data(), 1, buffer_.size(), bin_) != buffer_.size())
    throw std::runtime_error(sys_error("cannot write", bin_path(prefix_)));
  if (sequence_lengths.empty()) {
    if (!tokens.empty()) lengths_.push_back(static_cast<int32_t>(tokens.size()));
  } else {
    int64_t sum = 0;
    for (int32_t l : sequence_lengths) sum += l;
    if (sum != static_cast<int64_t>(tokens.size()))
      throw std::invalid_argument("indexed dataset writer '" + prefix_ + "': sequence lengths sum to " +
                                  std::to_string(sum) + " but the document has " + std::to_string(tokens.size()) + " tokens");
    lengths_.insert(lengths_.end(), sequence_lengths.begin(), sequence_lengths.end());
  }
  doc_indices_.push_back(static_cast<int64_t>(lengths_.size()));
}

void IndexedDatasetWriter::discard() noexcept {
  if (bin_) std::fclose(bin_);
  bin_ = nullptr;
  finalized_ = true;
  std::remove(bin_path(prefix_).c_str());
  std::remove(idx_path(prefix_).c_str());
}

void IndexedDatasetWriter::finalize() {
  if (finalized_) return;
  finalized_ = true;
  if (std::fclose(bin_) != 0) throw std::runtime_error(sys_error("cannot close", bin_path(prefix_)));
  bin_ = nullptr;
  write_index(idx_path(prefix_), dtype_, lengths_, doc_indices_);
}

void IndexedDatasetWriter::write_index(const std::string& idx_file, DType dtype, const std::vector<int32_t>& lengths,
                                       const std::vector<int64_t>& document_indices) {
  std::FILE* f = std::fopen(idx_file.c_str(), "wb");
  if (!f) throw std::runtime_error(sys_error("cannot create", idx_file));
  std::vector<char> out;
  auto put = [&](const void* p, size_t n) { out.insert(out.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n); };
  put(kMagic, 9);
  const uint64_t version = 1, n = lengths.size(), d = document_indices.size();
  const auto code = static_cast<uint8_t>(dtype);
  put(&version, 8);
  put(&code, 1);
  put(&n, 8);
  put(&d, 8);
  put(lengths.data(), 4 * n);
  const auto es = static_cast<int64_t>(dtype_size(dtype));
  int64_t ptr = 0;
  for (int32_t l : lengths) {
    put(&ptr, 8);
    ptr += int64_t{l} * es;
  }
  put(document_indices.data(), 8 * d);
  const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  if (std::fclose(f) != 0 || !ok) throw std::runtime_error(sys_error("cannot write", idx_file));
}

}  // namespace loom::data
