// Megatron's train/valid/test split string, e.g. "949,50,1" (megatron-core
// blended_megatron_dataset_config.py: parse_and_normalize_split,
// convert_split_vector_to_split_matrix; blended_megatron_dataset_builder.py for the ranges).
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace loom::data {

enum class Split { kTrain = 0, kValid = 1, kTest = 2 };
const char* split_name(Split s);  ///< "train", "valid", "test"

/// Fraction book-ends per split: the numbers of the string (missing ones are 0) normalised to
/// sum 1, accumulated left to right; a split whose share is 0 is std::nullopt. Throws DataError
/// naming the string if it has no number, more than three, or they sum to 0.
using SplitMatrix = std::array<std::optional<std::pair<double, double>>, 3>;
SplitMatrix parse_split(const std::string& splits_string);

/// Sequences [round(lo*N), round(hi*N)) of split `s` among N (round half to even, as Python).
std::pair<int64_t, int64_t> split_range(const SplitMatrix& m, Split s, int64_t n);

}  // namespace loom::data
