#include "model/kv_cache.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

namespace loom::model {

KvCache::KvCache(int first_layer, int num_layers, int64_t batch, int64_t heads_local,
                 int64_t head_dim, int64_t capacity, const at::TensorOptions& options)
    : first_layer_(first_layer),
      batch_(batch),
      heads_local_(heads_local),
      head_dim_(head_dim),
      capacity_(capacity) {
  if (num_layers < 0 || batch < 1 || heads_local < 1 || head_dim < 1 || capacity < 1)
    throw std::invalid_argument(
        "KvCache: expected num_layers >= 0 and positive batch, heads, head_dim and capacity, "
        "found " + std::to_string(num_layers) + " layers, batch " + std::to_string(batch) +
        ", heads " + std::to_string(heads_local) + ", head_dim " + std::to_string(head_dim) +
        ", capacity " + std::to_string(capacity));
  for (int i = 0; i < num_layers; ++i) {
    keys_.push_back(at::zeros({batch, heads_local, capacity, head_dim}, options));
    values_.push_back(at::zeros({batch, heads_local, capacity, head_dim}, options));
  }
}

std::pair<at::Tensor, at::Tensor> KvCache::append(int layer, const at::Tensor& k,
                                                  const at::Tensor& v) {
  const int index = layer - first_layer_;
  if (index < 0 || index >= static_cast<int>(keys_.size()))
    throw std::out_of_range("KvCache: layer " + std::to_string(layer) +
                            " is not cached here (layers " + std::to_string(first_layer_) + ".." +
                            std::to_string(first_layer_ + static_cast<int>(keys_.size()) - 1) + ")");
  if (k.dim() != 4 || k.size(0) != batch_ || k.size(1) != heads_local_ || k.size(3) != head_dim_ ||
      v.sizes() != k.sizes())
    throw std::invalid_argument("KvCache: expected keys and values [" + std::to_string(batch_) +
                                ", " + std::to_string(heads_local_) + ", n, " +
                                std::to_string(head_dim_) + "], found " + c10::str(k.sizes()) +
                                " and " + c10::str(v.sizes()));
  const int64_t n = k.size(2);
  if (length_ + n > capacity_)
    throw std::out_of_range("KvCache: " + std::to_string(length_) + " cached + " +
                            std::to_string(n) + " new positions exceed the capacity " +
                            std::to_string(capacity_));
  keys_[index].narrow(2, length_, n).copy_(k);
  values_[index].narrow(2, length_, n).copy_(v);
  return {keys_[index].narrow(2, 0, length_ + n), values_[index].narrow(2, 0, length_ + n)};
}

void KvCache::advance(int64_t n) {
  if (n < 0 || length_ + n > capacity_)
    throw std::out_of_range("KvCache: cannot advance " + std::to_string(n) + " positions from " +
                            std::to_string(length_) + " (capacity " + std::to_string(capacity_) +
                            ")");
  length_ += n;
}

}  // namespace loom::model
