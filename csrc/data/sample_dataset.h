// What the trainer reads: a dataset of GPT training samples, torch-free. GptDataset and
// BlendedDataset implement it; the trainer turns samples into tensors.
#pragma once
#include <cstdint>
#include <vector>

namespace loom::data {

/// One GPT sample of sequence length S, as megatron-core's GPTDataset.__getitem__ returns it
/// (without the attention mask, which is causal, and position ids, which are 0..S-1).
struct GptSample {
  std::vector<int64_t> tokens;   ///< [S] input ids: text[0:S] (padding replaced by 0)
  std::vector<int64_t> labels;   ///< [S] targets: text[1:S+1] (padding replaced by 0)
  std::vector<float> loss_mask;  ///< [S] 1, or 0 where tokens == EOD (eod_mask_loss) or labels are padding
  int32_t dataset_id = 0;        ///< which blended component it came from (0 if not blended)
};

class SampleDataset {
 public:
  virtual ~SampleDataset() = default;
  /// Number of samples; ids are [0, size()).
  virtual int64_t size() const = 0;
  /// The sample with this id; throws std::out_of_range outside [0, size()). Thread-safe.
  virtual GptSample get(int64_t id) const = 0;
  /// The S + 1 raw token ids of sample `id` (padding = -1), before the tokens/labels shift.
  virtual std::vector<int64_t> text(int64_t id) const = 0;
};

}  // namespace loom::data
