// The three index arrays behind Megatron's GPTDataset (docs/design/formats.md, "GPT samples"; megatron-core
// gpt_dataset.py `_build_document_sample_shuffle_indices` and helpers.cpp `build_sample_idx`),
// built with the same RNG (numpy RandomState(seed)) in the same order of use, so the samples
// and their order equal megatron-core's.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/unaligned_array.h"

namespace loom::data {

struct GptIndexParams {
  int64_t seq_length = 0;                 ///< S; each sample reads S + 1 tokens (one overlap)
  uint32_t seed = 0;                      ///< numpy RandomState seed
  std::optional<int64_t> num_samples;     ///< wanted samples; nullopt = exactly one epoch
  bool drop_last_partial_sequence = true; ///< Megatron: true except for valid (configurable)
  bool add_extra_token = true;            ///< samples of S + 1 tokens
};

struct GptIndices {
  /// Sequence ids of the split tiled over the epochs and shuffled (int32, like Megatron).
  std::vector<int32_t> document_index;
  /// [num_samples + 1, 2] row-major: (position in document_index, token offset) where each
  /// sample starts; sample i spans row i to row i + 1 (inclusive of the extra token).
  std::vector<int64_t> sample_index;
  /// A permutation of [0, num_samples) (the last epoch permuted on its own when separated).
  std::vector<int64_t> shuffle_index;
  int64_t num_epochs = 0;
  bool separate_final_epoch = false;
  int64_t num_samples() const { return static_cast<int64_t>(sample_index.size() / 2) - 1; }
};

/// Tokens in one epoch of sequences [begin, end).
int64_t tokens_per_epoch(UnalignedArray<int32_t> sequence_lengths, int64_t begin, int64_t end);

/// Smallest E >= 1 with E * tokens_per_epoch >= num_samples * S + add_extra_token (1 when
/// num_samples is nullopt).
int64_t num_epochs_for(int64_t tokens_per_epoch, const GptIndexParams& p);

/// Builds document, sample and shuffle indices for sequences [begin, end) with `lengths` the
/// sequence lengths of the whole indexed dataset. Throws DataError if the range holds fewer
/// than 2 tokens or seq_length < 2.
GptIndices build_gpt_indices(UnalignedArray<int32_t> lengths, int64_t begin, int64_t end, const GptIndexParams& p);

/// Why `indices` (e.g. read back from an index cache) cannot be the indices build_gpt_indices
/// makes for these arguments, or "" when they can: the document index must tile sequences
/// [begin, end) once per epoch, the sample index must have the expected number of rows, each
/// sample a readable span of the documents, and the shuffle index must be a permutation. The
/// checks are linear and bound every access GptDataset makes, so a corrupt or hostile cache
/// can be told from a good one before it is used.
std::string check_gpt_indices(const GptIndices& indices, UnalignedArray<int32_t> lengths, int64_t begin, int64_t end,
                              const GptIndexParams& p);

/// helpers.cpp build_sample_idx: [n + 1, 2] sample starts over `document_index`.
std::vector<int64_t> build_sample_index(UnalignedArray<int32_t> lengths, const std::vector<int32_t>& document_index,
                                        int64_t seq_length, int64_t num_epochs, int64_t tokens_per_epoch,
                                        bool drop_last_partial_sequence, bool add_extra_token);

}  // namespace loom::data
