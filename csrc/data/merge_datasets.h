// Joins Megatron indexed datasets into one, as Megatron-LM's tools/merge_datasets.py does
// (megatron-core IndexedDatasetBuilder.add_index for each input, then finalize): the .bin files
// concatenated, sequence lengths appended, document indices offset, pointers recomputed. Merging
// the outputs of `loom preprocess --partition I/N` for I = 0..N-1 in order gives the same bytes
// as preprocessing all inputs in one go (docs/design/corpus_inputs.md).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace loom::data {

/// Prefixes of the datasets in `directory`: every `<name>.idx` with a `<name>.bin` beside it,
/// sorted by name (bytewise, as Megatron's sorted(os.listdir) does: zero-pad partition numbers).
/// Throws DataError naming the directory when it holds none, or an .idx without its .bin.
std::vector<std::string> datasets_in_directory(const std::string& directory);

struct MergeResult {
  int64_t sequences = 0, documents = 0, bytes = 0;
};

/// Writes {output_prefix}.bin/.idx from `prefixes` in order. Every input is validated as
/// IndexedDataset does; their dtypes must agree. Throws DataError naming the input that differs
/// or is malformed, or when an output path is one of the inputs; the output is written under a
/// temporary name and renamed when complete (removed on failure).
MergeResult merge_datasets(const std::vector<std::string>& prefixes, const std::string& output_prefix);

}  // namespace loom::data
