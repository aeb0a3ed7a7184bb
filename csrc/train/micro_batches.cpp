#include "train/micro_batches.h"

#include <ATen/ATen.h>

#include <stdexcept>

namespace loom::train {

MicroBatch make_micro_batch(const data::SampleDataset& dataset, const std::vector<int64_t>& ids,
                            int64_t global_row, at::Device device) {
  if (ids.empty()) throw std::invalid_argument("make_micro_batch: no sample ids");
  const int64_t b = static_cast<int64_t>(ids.size());
  int64_t s = -1;
  std::vector<int64_t> tokens, labels;
  std::vector<float> mask;
  for (int64_t id : ids) {
    data::GptSample sample = dataset.get(id);
    if (s < 0) s = static_cast<int64_t>(sample.tokens.size());
    if (static_cast<int64_t>(sample.tokens.size()) != s) {
      throw std::logic_error("samples of one micro-batch differ in length");
    }
    tokens.insert(tokens.end(), sample.tokens.begin(), sample.tokens.end());
    labels.insert(labels.end(), sample.labels.begin(), sample.labels.end());
    mask.insert(mask.end(), sample.loss_mask.begin(), sample.loss_mask.end());
  }
  auto i64 = at::TensorOptions().dtype(at::kLong);
  MicroBatch mb;
  mb.tokens = at::from_blob(tokens.data(), {b, s}, i64).clone().to(device);
  mb.labels = at::from_blob(labels.data(), {b, s}, i64).clone().to(device);
  mb.loss_mask = at::from_blob(mask.data(), {b, s}, at::kFloat).clone().to(device);
  mb.position_ids = at::arange(s, i64.device(device)).unsqueeze(0).expand({b, s}).contiguous();
  mb.global_row = global_row;
  return mb;
}

}  // namespace loom::train
