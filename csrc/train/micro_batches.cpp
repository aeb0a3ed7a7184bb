#include "train/micro_batches.h"

#include <ATen/ATen.h>

#include <stdexcept>

namespace loom::train {
namespace {

// A host tensor the rows are written into: pinned when it is bound for an accelerator, so that
// the copy to the device is asynchronous (the caching host allocator keeps the block until the
// copy has completed).
at::Tensor host_buffer(int64_t b, int64_t s, at::ScalarType dtype, at::Device device) {
  return at::empty({b, s}, at::TensorOptions().dtype(dtype).pinned_memory(!device.is_cpu()));
}

}  // namespace

MicroBatch make_micro_batch(const std::vector<data::GptSample>& samples, int64_t global_row, at::Device device) {
  if (samples.empty()) throw std::invalid_argument("make_micro_batch: no samples");
  const int64_t b = static_cast<int64_t>(samples.size());
  const int64_t s = static_cast<int64_t>(samples.front().tokens.size());
  at::Tensor tokens = host_buffer(b, s, at::kLong, device);
  at::Tensor labels = host_buffer(b, s, at::kLong, device);
  at::Tensor mask = host_buffer(b, s, at::kFloat, device);
  for (int64_t row = 0; row < b; ++row) {
    const auto& sample = samples[row];
    if (static_cast<int64_t>(sample.tokens.size()) != s)
      throw std::logic_error("samples of one micro-batch differ in length");
    std::copy(sample.tokens.begin(), sample.tokens.end(), tokens.data_ptr<int64_t>() + row * s);
    std::copy(sample.labels.begin(), sample.labels.end(), labels.data_ptr<int64_t>() + row * s);
    std::copy(sample.loss_mask.begin(), sample.loss_mask.end(), mask.data_ptr<float>() + row * s);
  }
  const auto on_device = at::TensorOptions().device(device);
  MicroBatch mb;
  mb.tokens = tokens.to(on_device, /*non_blocking=*/true);
  mb.labels = labels.to(on_device, /*non_blocking=*/true);
  mb.loss_mask = mask.to(on_device, /*non_blocking=*/true);
  mb.position_ids =
      at::arange(s, on_device.dtype(at::kLong)).unsqueeze(0).expand({b, s}).contiguous();
  mb.global_row = global_row;
  return mb;
}

}  // namespace loom::train
