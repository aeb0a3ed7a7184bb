// Megatron's BlendedDataset: samples drawn from several datasets in proportion to weights
// (docs/design/formats.md, "Blending"; megatron-core blended_dataset.py and helpers.cpp
// build_blending_indices). Sample i comes from the component whose sampling error
// weight * max(i, 1) - drawn_so_far is largest (first on ties), and is that component's next
// unused sample.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "data/sample_dataset.h"

namespace loom::data {

struct BlendingIndices {
  std::vector<int16_t> dataset_index;         ///< component of each blended sample
  std::vector<int64_t> dataset_sample_index;  ///< sample id within that component
};

/// build_blending_indices for `size` samples and weights that sum to 1.
BlendingIndices build_blending_indices(const std::vector<double>& weights, int64_t size);

/// Why the two arrays (e.g. read back from a cache) cannot be blending indices of `size`
/// samples over `components` datasets, or "" when they can: every component id in range and
/// each component's samples handed out in order 0, 1, 2, ...
std::string check_blending_indices(const std::vector<int64_t>& dataset_index,
                                   const std::vector<int64_t>& dataset_sample_index, size_t components,
                                   int64_t size);

class BlendedDataset final : public SampleDataset {
 public:
  /// `weights` are normalised here. Throws DataError naming the component if the blend would
  /// draw more samples from a component than it has (the index never points past a component),
  /// or if the weights are not all positive. With a non-empty `cache_dir` the indices are cached
  /// as {hash}-BlendedDataset-{split}-dataset_index.npy / -dataset_sample_index.npy, the hash
  /// covering `description` (the components' descriptions), the weights and the size.
  BlendedDataset(std::vector<std::shared_ptr<const SampleDataset>> datasets, std::vector<double> weights,
                 int64_t size, const std::string& description = "", const std::string& cache_dir = "");

  int64_t size() const override { return static_cast<int64_t>(indices_.dataset_index.size()); }
  GptSample get(int64_t id) const override;
  std::vector<int64_t> text(int64_t id) const override;
  const BlendingIndices& indices() const { return indices_; }
  const std::vector<double>& weights() const { return weights_; }
  /// Non-empty when a matching cache entry was found damaged and rebuilt (names the files).
  const std::string& cache_warning() const { return cache_warning_; }

 private:
  void check(int64_t id) const;
  std::string cache_warning_;
  std::vector<std::shared_ptr<const SampleDataset>> datasets_;
  std::vector<double> weights_;
  BlendingIndices indices_;
};

}  // namespace loom::data
