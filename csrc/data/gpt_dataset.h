// Megatron's GPTDataset over one indexed dataset and one split (docs/design/formats.md, "GPT samples";
// megatron-core gpt_dataset.py). Samples, their order and their masks equal megatron-core's for
// the same files, split, sequence length, sample count and seed.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "data/gpt_indices.h"
#include "data/indexed_dataset.h"
#include "data/sample_dataset.h"
#include "data/split.h"

namespace loom::data {

struct GptDatasetOptions {
  int64_t seq_length = 0;
  uint32_t seed = 0;
  std::optional<int64_t> num_samples;  ///< at least this many samples (whole epochs are built)
  bool eod_mask_loss = false;
  int64_t eod_id = 50256;
  bool drop_last_partial_validation_sequence = true;  ///< Megatron's default
  /// Directory for the cached indices ("" = build in memory, no cache). Files are named
  /// {hash}-GPTDataset-{split}-{document,sample,shuffle}_index.npy plus -description.txt, the
  /// hash being FNV-1a 64 of the description (path, split range, num_samples, seed, sequence
  /// length and the dataset's size). Files are written to a temporary name and renamed, so
  /// ranks racing to build them never read a partial file.
  std::string cache_dir;
};

class GptDataset final : public SampleDataset {
 public:
  /// Samples from sequences [range.first, range.second) of `data` (split `split`). Loads the
  /// indices from options.cache_dir when present, matching and consistent with the data
  /// (check_gpt_indices), else builds (and caches) them.
  GptDataset(std::shared_ptr<const IndexedDataset> data, Split split, std::pair<int64_t, int64_t> range,
             const GptDatasetOptions& options);

  int64_t size() const override { return indices_.num_samples(); }
  GptSample get(int64_t id) const override;
  std::vector<int64_t> text(int64_t id) const override;

  const GptIndices& indices() const { return indices_; }
  Split split() const { return split_; }
  /// The text the cache hash is computed from.
  const std::string& description() const { return description_; }
  bool loaded_from_cache() const { return from_cache_; }
  /// Non-empty when a cache entry matching this dataset was found damaged and rebuilt: says
  /// which file and what was wrong (the trainer logs it).
  const std::string& cache_warning() const { return cache_warning_; }

 private:
  /// Loads the cache entry `base`* into indices_ when present, matching and sound.
  bool load_cache(const std::string& base, std::pair<int64_t, int64_t> range, const GptIndexParams& p);

  std::shared_ptr<const IndexedDataset> data_;
  Split split_;
  GptDatasetOptions options_;
  GptIndices indices_;
  std::string description_;
  std::string cache_warning_;
  bool from_cache_ = false;
};

/// 64-bit FNV-1a of `text` as 16 hex digits (used for cache file names).
std::string fnv1a_hex(const std::string& text);

}  // namespace loom::data
