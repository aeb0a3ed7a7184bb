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
  at::Tensor position_ids;  ///< [b, s] int64, 0..s-1 per row (packed rows: restarting per example)
  /// [b, s] int64, packed rows only (docs/design/finetune.md, "Packed sequences"): the example
  /// each position belongs to (0, 1, ... in row order; padding after the last example takes the
  /// next id); attention stays among equal ids. Undefined: each row is one sequence.
  at::Tensor segment_ids;
  /// Row of the global batch holding this micro-batch's first sample (for dropout keys).
  int64_t global_row = 0;
  /// Virtual tokens for the first pipeline stage's embeddings (prompt learning only).
  model::PromptSplice prompt;
};

/// The row of the global batch where micro-batch `k` of data-parallel rank `dp_rank` starts:
/// Megatron's sampler hands out micro_batch·d consecutive ids per micro-step and rank r takes
/// slice r, so the rows start at (k·d + r)·micro_batch (dropout keys use it).
inline int64_t micro_batch_global_row(int64_t k, int64_t d, int64_t dp_rank, int64_t micro_batch) {
  return (k * d + dp_rank) * micro_batch;
}

/// `samples` (all of one length S) as one micro-batch on `device`. Throws std::invalid_argument
/// for no samples, std::logic_error for samples of different lengths.
MicroBatch make_micro_batch(const std::vector<data::GptSample>& samples, int64_t global_row, at::Device device);

}  // namespace loom::train
