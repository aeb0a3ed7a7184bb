// A training step's micro-batches for one data-parallel rank, as tensors.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "data/sample_dataset.h"
#include "model/prompt_splice.h"

namespace loom::train {

struct MicroBatch {
  at::Tensor tokens;        ///< [b, s] int64
  at::Tensor labels;        ///< [b, s] int64
  at::Tensor loss_mask;     ///< [b, s] float32 (1 = the token's loss counts)
  at::Tensor position_ids;  ///< [b, s] int64, 0..s-1 per row
  /// Row of the global batch holding this micro-batch's first sample (for dropout keys).
  int64_t global_row = 0;
  /// Virtual tokens for the first pipeline stage's embeddings (prompt learning only).
  model::PromptSplice prompt;
};

/// Reads samples `ids` of `dataset` into one micro-batch on `device`. Throws std::out_of_range
/// for an id outside the dataset.
MicroBatch make_micro_batch(const data::SampleDataset& dataset, const std::vector<int64_t>& ids,
                            int64_t global_row, at::Device device);

}  // namespace loom::train
