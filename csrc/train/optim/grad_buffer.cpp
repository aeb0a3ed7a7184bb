#include "train/optim/grad_buffer.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

namespace loom::train::optim {

GradBuffer::GradBuffer(model::ParamList params, GradBufferOptions options)
    : params_(std::move(params)), options_(options) {
  if (options_.bucket_bytes < 1)
    throw std::invalid_argument("grad buffer: bucket_bytes must be >= 1, got " + std::to_string(options_.bucket_bytes));
  if (options_.pad_multiple < 1)
    throw std::invalid_argument("grad buffer: pad_multiple must be >= 1, got " + std::to_string(options_.pad_multiple));
  const at::Device device = options_.device;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& p = params_[i];
    if (!p.tensor.defined()) throw std::invalid_argument("grad buffer: parameter '" + p.name + "' is undefined");
    if (!at::isFloatingType(p.tensor.scalar_type()))
      throw std::invalid_argument("grad buffer: parameter '" + p.name + "' is not floating point");
    if (p.tensor.device() != device)
      throw std::invalid_argument("grad buffer: parameter '" + p.name + "' is on " + p.tensor.device().str() +
                                  ", the run's device is " + device.str());
    for (size_t j = 0; j < i; ++j) {
      if (params_[j].tensor.is_same(p.tensor))
        throw std::invalid_argument("grad buffer: parameter '" + p.name + "' is the same tensor as '" +
                                    params_[j].name + "'");
    }
  }
  // Backprop order: the last parameter's gradient is ready first.
  offsets_.assign(params_.size(), 0);
  const int64_t bucket_elems = (options_.bucket_bytes + 3) / 4;
  const int64_t pad = options_.pad_multiple;
  int64_t pos = 0;
  GradBucket current;
  auto close = [&] {
    int64_t used = pos - current.offset;
    current.numel = (used + pad - 1) / pad * pad;
    pos = current.offset + current.numel;
    buckets_.push_back(current);
    current = GradBucket{};
    current.offset = pos;
  };
  for (size_t k = params_.size(); k-- > 0;) {
    offsets_[k] = pos;
    pos += params_[k].tensor.numel();
    current.params.push_back(k);
    if ((pos - current.offset) >= bucket_elems) close();
  }
  if (!current.params.empty()) close();
  data_ = at::zeros({pos}, at::TensorOptions().dtype(at::kFloat).device(device));
}

at::Tensor GradBuffer::main_grad(size_t i) const {
  const auto& p = params_.at(i).tensor;
  return data_.narrow(0, offsets_[i], p.numel()).view(p.sizes());
}

at::Tensor GradBuffer::bucket_view(size_t b) const {
  const auto& bucket = buckets_.at(b);
  return data_.narrow(0, bucket.offset, bucket.numel);
}

void GradBuffer::accumulate() {
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& grad = params_[i].tensor.mutable_grad();
    if (!grad.defined()) continue;
    main_grad(i).add_(grad);  // type promotion: fp32 += bf16/fp16 in fp32
    grad.reset();
  }
}

void GradBuffer::zero() {
  data_.zero_();
  for (auto& p : params_) p.tensor.mutable_grad().reset();
}

}  // namespace loom::train::optim
