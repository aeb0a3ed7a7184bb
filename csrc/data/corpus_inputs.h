// The input files of a preprocessing run and the share of them one partition takes
// (docs/design/corpus_inputs.md).
//
// Expansion: each --input is a file, a directory (its files, recursively, hidden ones and
// `.idx`/`.bin` left out) or a glob pattern (glob(3), `*?[...]`); each argument's files are
// sorted by path (bytewise) and arguments keep their order. A file named twice is an error.
//
// Partition I/N (0 <= I < N): with at least N files, partition I takes the contiguous block
// of files [floor(I*F/N), floor((I+1)*F/N)); with fewer files than N, the unit is documents:
// partition I takes the documents whose first byte lies in [floor(I*B/N), floor((I+1)*B/N))
// of the concatenated decompressed inputs (B bytes). Either way the partitions, in order, hold
// exactly the documents of the whole run in its order, so merging them (merge_datasets.h)
// gives the one-go output byte for byte.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "data/input_stream.h"

namespace loom::data {

/// Files of the --input arguments in the order above. Throws DataError naming the argument
/// when it matches nothing, or a file listed twice.
std::vector<std::string> expand_inputs(const std::vector<std::string>& arguments);

struct Partition {
  int64_t index = 0, count = 1;
  bool whole() const { return count == 1; }
};
/// Parses "I/N". Throws DataError quoting the spec unless both are integers, N >= 1, 0 <= I < N.
Partition parse_partition(const std::string& spec);

/// A partition's share: the files it reads and, when the unit is documents, the byte range
/// (of the concatenated decompressed inputs) its documents start in.
struct PartitionShare {
  std::vector<std::string> files;
  bool by_documents = false;
  int64_t first_byte = 0, end_byte = 0;  ///< [first, end) when by_documents
};
/// `total_bytes` is called (only when the unit is documents) for B.
PartitionShare partition_share(const std::vector<std::string>& files, const Partition& p,
                               const std::function<int64_t(const std::vector<std::string>&)>& total_bytes);

/// Decompressed size of the files together (reads compressed ones through, line by line: a
/// line longer than max_line_bytes throws DataError, as LineStream says).
int64_t decompressed_bytes(const std::vector<std::string>& files, int64_t max_line_bytes = kDefaultMaxLineBytes);

}  // namespace loom::data
