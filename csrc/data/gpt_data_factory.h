// Builds the train/valid/test GPT datasets from a recipe's `model.data` section the way
// megatron-core's BlendedMegatronDatasetBuilder does for GPTDataset (blend + split string),
// so a NeMo/Megatron user gets the same samples in the same order.
//
// Example (one corpus, 2000 training samples of 1024 tokens):
//   GptDataConfig c;
//   c.data_prefix = {"data/owt_text_document"};           // or {"0.3", "a", "0.7", "b"}
//   c.splits_string = "949,50,1"; c.seq_length = 1024; c.seed = 1234;
//   c.num_samples = {2000, 120, 40};
//   c.index_cache_dir = "runs/x/index_cache";
//   auto ds = build_gpt_datasets(c);
//   GptSample s = ds.train->get(0);   // tokens/labels/loss_mask, each [1024]
#pragma once
#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/sample_dataset.h"

namespace loom::data {

struct GptDataConfig {
  /// Megatron's --data-path / NeMo's data_prefix: prefixes alone, or weight, prefix, weight,
  /// prefix, ... (weights need not sum to 1). Prefixes name {prefix}.bin/.idx.
  std::vector<std::string> data_prefix;
  std::string splits_string = "969,30,1";
  int64_t seq_length = 0;
  uint32_t seed = 1234;
  /// Samples wanted per split (train, valid, test); nullopt = one epoch of that split.
  std::array<std::optional<int64_t>, 3> num_samples;
  bool eod_mask_loss = false;
  int64_t eod_id = 50256;
  /// Where the index caches go ("" = no cache).
  std::string index_cache_dir;
  /// Extra fraction of samples each blended component builds (megatron-core default 0.005).
  double mid_level_dataset_surplus = 0.005;
  bool drop_last_partial_validation_sequence = true;
  /// When > 0, every indexed dataset is scanned once and a token id outside [0, vocab_size)
  /// is an error naming the file, sequence and position.
  int64_t vocab_size = 0;
};

struct GptDatasets {
  std::shared_ptr<const SampleDataset> train, valid, test;  ///< null when the split's share is 0
  /// Index cache entries found damaged and rebuilt, one line each naming the files.
  std::vector<std::string> warnings;
  const std::shared_ptr<const SampleDataset>& operator[](int split) const {
    return split == 0 ? train : split == 1 ? valid : test;
  }
};

/// Parsed data_prefix: (prefixes, weights) with weights empty when none were given
/// (megatron-core utils.get_blend_from_list). Throws DataError on an empty list or a
/// non-numeric/negative weight where weights are expected.
std::pair<std::vector<std::string>, std::vector<double>> parse_data_prefix(const std::vector<std::string>& data_prefix);

/// Opens the indexed datasets and builds the three splits. Throws DataError for bad input
/// (files, split string, weights, a blend that would oversample a component, a split of fewer
/// than 2 tokens: named by splits_string and the split).
GptDatasets build_gpt_datasets(const GptDataConfig& config);

}  // namespace loom::data
