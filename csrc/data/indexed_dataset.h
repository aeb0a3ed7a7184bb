// Megatron's indexed dataset: a `.bin` file of token arrays and its `.idx` index, read through
// mmap and written byte for byte as megatron-core's IndexedDatasetBuilder writes them
// (docs/design/formats.md, "Megatron indexed dataset"; megatron/core/datasets/indexed_dataset.py).
//
// .idx layout (little-endian): magic "MMIDIDX\0\0" | version u64 = 1 | dtype code u8 |
// sequence count N u64 | document count D u64 | N int32 lengths | N int64 byte pointers |
// D int64 document indices (first 0, last N). Pointers are 64-bit: .bin files beyond 2 GiB work.
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/unaligned_array.h"

namespace loom::data {

/// Element type of the token arrays; the value is the .idx dtype code.
enum class DType : uint8_t {
  kUInt8 = 1, kInt8 = 2, kInt16 = 3, kInt32 = 4, kInt64 = 5, kFloat64 = 6, kFloat32 = 7, kUInt16 = 8
};
size_t dtype_size(DType t);
const char* dtype_name(DType t);
/// Whether `code` is one of the eight codes above.
bool valid_dtype_code(uint8_t code);
/// Megatron's choice for token ids: uint16 when the vocabulary has fewer than 65500 entries,
/// else int32.
DType token_dtype_for_vocab(size_t vocab_size);

std::string idx_path(const std::string& prefix);  ///< prefix + ".idx"
std::string bin_path(const std::string& prefix);  ///< prefix + ".bin"

/// Read-only, memory-mapped view of {prefix}.idx and {prefix}.bin.
/// Construction validates the index: magic, version, dtype code, counts against the file size
/// (truncation), document indices (0 first, N last, non-decreasing, within [0, N]), non-negative
/// lengths and pointers, and - with the .bin open - that every sequence lies inside the .bin
/// and that the dtype agrees with the data (the pointers' stride and the .bin's bytes per token).
/// Any violation throws DataError naming the file and what was expected and found.
class IndexedDataset {
 public:
  /// Opens both files; with `open_bin` false only the .idx is opened and validated (sequence
  /// bytes cannot be read then), e.g. to inspect the index of a corpus stored elsewhere.
  explicit IndexedDataset(const std::string& prefix, bool open_bin = true);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  DType dtype() const { return dtype_; }
  size_t num_sequences() const { return num_sequences_; }
  /// Number of documents: document_indices().size() - 1.
  size_t num_documents() const { return num_doc_indices_ - 1; }
  /// The .idx arrays, read in place (they are not aligned for their types: unaligned_array.h).
  UnalignedArray<int32_t> sequence_lengths() const { return lengths_; }
  UnalignedArray<int64_t> sequence_pointers() const { return pointers_; }
  UnalignedArray<int64_t> document_indices() const { return doc_indices_; }
  size_t num_document_indices() const { return num_doc_indices_; }
  /// Total token count over all sequences.
  int64_t num_tokens() const;

  /// Appends tokens [offset, offset + length) of sequence `seq` (length defaults to the rest of
  /// the sequence), widened to int64, to out. Throws std::out_of_range naming the file on a bad
  /// sequence index or span, DataError for a float token that has no int64 value.
  void read(size_t seq, size_t offset, std::optional<size_t> length, std::vector<int64_t>& out) const;
  std::vector<int64_t> read(size_t seq) const;

  /// Checks every token is an integer in [0, vocab_size); throws DataError naming the file, the
  /// sequence, the position and the value of the first one that is not.
  void check_token_range(int64_t vocab_size) const;

 private:
  /// Bytes per token the pointers were written with (1, 2, 4 or 8); 0 when the lengths cannot
  /// tell (fewer than two sequences, or empty ones) or no size fits.
  int pointer_element_size() const;

  std::string prefix_;
  DType dtype_ = DType::kUInt16;
  size_t num_sequences_ = 0, num_doc_indices_ = 0;
  UnalignedArray<int32_t> lengths_;
  UnalignedArray<int64_t> pointers_, doc_indices_;
  struct Mapping;
  std::unique_ptr<Mapping> idx_map_, bin_map_;
};

/// Writes {prefix}.bin while documents are added, then {prefix}.idx on finalize(), producing the
/// same bytes as megatron-core's IndexedDatasetBuilder (add_document + finalize).
class IndexedDatasetWriter {
 public:
  /// Creates/truncates {prefix}.bin. Integer dtypes only.
  IndexedDatasetWriter(const std::string& prefix, DType dtype);
  ~IndexedDatasetWriter();
  /// Adds one document. `sequence_lengths` splits `tokens` into sequences (sum must equal
  /// tokens.size()); empty means one sequence holding all tokens (none if `tokens` is empty).
  /// Throws DataError if a token does not fit the dtype.
  void add_document(const std::vector<int32_t>& tokens, const std::vector<int32_t>& sequence_lengths = {});
  /// Writes {prefix}.idx and closes the .bin. Called by the destructor if neither this nor
  /// discard() was.
  void finalize();
  /// Closes and removes {prefix}.bin (and an .idx already written): for a run that failed.
  void discard() noexcept;
  size_t num_sequences() const { return lengths_.size(); }
  size_t num_documents() const { return doc_indices_.size() - 1; }

  /// Writes an index file from its parts (pointers computed as Megatron does: cumulative
  /// length x element size, 64-bit). Used by finalize(); public for tests and tools.
  static void write_index(const std::string& idx_file, DType dtype, const std::vector<int32_t>& lengths,
                          const std::vector<int64_t>& document_indices);

 private:
  std::string prefix_;
  DType dtype_;
  std::FILE* bin_ = nullptr;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> doc_indices_{0};
  std::vector<char> buffer_;
  bool finalized_ = false;
};

}  // namespace loom::data
