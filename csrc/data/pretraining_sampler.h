// Megatron's MegatronPretrainingSampler (megatron/training/datasets/data_samplers.py): sample
// ids consumed in order from `consumed_samples`; each step takes micro_batch x dp_size
// consecutive ids and data-parallel rank r gets ids [r*micro_batch, (r+1)*micro_batch) of them.
// Resuming with the consumed_samples saved in a checkpoint continues exactly where it stopped.
// Every rank reads its own micro-batches (Megatron reads them on tensor rank 0 and broadcasts).
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

namespace loom::data {

class PretrainingSampler {
 public:
  /// Throws DataError when total_samples <= 0, consumed_samples >= total_samples,
  /// micro_batch_size <= 0, dp_size <= 0 or dp_rank outside [0, dp_size).
  PretrainingSampler(int64_t total_samples, int64_t consumed_samples, int64_t micro_batch_size, int64_t dp_rank,
                     int64_t dp_size, bool drop_last = true);
  /// This rank's next micro batch of sample ids, or nullopt when the data is exhausted (a final
  /// partial step is returned, cut the same way, only when drop_last is false).
  std::optional<std::vector<int64_t>> next();
  /// Samples consumed by all ranks together after the steps returned so far.
  int64_t consumed_samples() const { return position_; }

 private:
  int64_t total_, position_, micro_, rank_, size_;
  bool drop_last_;
};

}  // namespace loom::data
