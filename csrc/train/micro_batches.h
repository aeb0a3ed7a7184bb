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

/// `samples` (all of one length S) as one micro-batch on `device`. Throws std::invalid_argument
/// for no samples, std::logic_error for samples of different lengths.
MicroBatch make_micro_batch(const std::vector<data::GptSample>& samples, int64_t global_row, at::Device device);

}  // namespace loom::train
