#include "model/kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace loom::model {

KvCache::KvCache(int first_layer, int num_layers, int64_t batch, int64_t heads_local,
                 int64_t head_dim, int64_t capacity, const at::TensorOptions& options)
    : first_layer_(first_layer),
      batch_(batch),
      heads_local_(heads_local),
      head_dim_(head_dim),
      capacity_(capacity),
      lengths_(static_cast<size_t>(std::max<int64_t>(batch, 0)), 0) {
  if (num_layers < 0 || batch < 1 || heads_local < 1 || head_dim < 1 || capacity < 1)
    throw std::invalid_argument(
        "KvCache: expected num_layers >= 0 and positive batch, heads, head_dim and capacity, "
        "found " + std::to_string(num_layers) + " layers, batch " + std::to_string(batch) +
        ", heads " + std::to_string(heads_local) + ", head_dim " + std::to_string(head_dim) +
        ", capacity " + std::to_string(capacity));
  for (int64_t r = 0; r < batch; ++r) selected_.push_back(r);
  for (int i = 0; i < num_layers; ++i) {
    keys_.push_back(at::zeros({batch, heads_local, capacity, head_dim}, options));
    values_.push_back(at::zeros({batch, heads_local, capacity, head_dim}, options));
  }
}

int64_t KvCache::length() const {
  int64_t longest = 0;
  for (int64_t r : selected_) longest = std::max(longest, lengths_[static_cast<size_t>(r)]);
  return longest;
}

bool KvCache::all_selected() const {
  if (static_cast<int64_t>(selected_.size()) != batch_) return false;
  for (int64_t i = 0; i < batch_; ++i)
    if (selected_[static_cast<size_t>(i)] != i) return false;
  return true;
}

bool KvCache::one_length() const {
  for (int64_t r : selected_)
    if (lengths_[static_cast<size_t>(r)] != lengths_[static_cast<size_t>(selected_.front())]) return false;
  return true;
}

void KvCache::select_rows(const std::vector<int64_t>& rows) {
  std::vector<bool> seen(static_cast<size_t>(batch_), false);
  for (int64_t r : rows) {
    if (r < 0 || r >= batch_ || seen[static_cast<size_t>(r)])
      throw std::out_of_range("KvCache::select_rows: row " + std::to_string(r) +
                              " is outside [0, " + std::to_string(batch_) + ") or named twice");
    seen[static_cast<size_t>(r)] = true;
  }
  selected_ = rows;
  if (selected_.empty())
    for (int64_t r = 0; r < batch_; ++r) selected_.push_back(r);
}

void KvCache::reset() {
  std::fill(lengths_.begin(), lengths_.end(), 0);
  select_rows({});
}

at::Tensor KvCache::positions(int64_t n, const at::TensorOptions& options) const {
  std::vector<int64_t> start;
  for (int64_t r : selected_) start.push_back(lengths_[static_cast<size_t>(r)]);
  const auto long_options = options.dtype(at::kLong);
  return at::tensor(start, long_options).unsqueeze(1) + at::arange(n, long_options).unsqueeze(0);  // [b, n]
}

std::optional<at::Tensor> KvCache::attention_mask(int64_t n, const at::Device& device) const {
  if (one_length()) return std::nullopt;
  const auto long_options = at::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor last_visible = positions(n, long_options).view({batch(), 1, n, 1});   // query i of row r
  const at::Tensor keys = at::arange(length() + n, long_options).view({1, 1, 1, length() + n});
  return keys > last_visible;  // [b, 1, n, L + n] bool
}

std::pair<at::Tensor, at::Tensor> KvCache::append(int layer, const at::Tensor& k,
                                                  const at::Tensor& v) {
  const int index = layer - first_layer_;
  if (index < 0 || index >= static_cast<int>(keys_.size()))
    throw std::out_of_range("KvCache: layer " + std::to_string(layer) +
                            " is not cached here (layers " + std::to_string(first_layer_) + ".." +
                            std::to_string(first_layer_ + static_cast<int>(keys_.size()) - 1) + ")");
  if (k.dim() != 4 || k.size(0) != batch() || k.size(1) != heads_local_ || k.size(3) != head_dim_ ||
      v.sizes() != k.sizes())
    throw std::invalid_argument("KvCache: expected keys and values [" + std::to_string(batch()) +
                                ", " + std::to_string(heads_local_) + ", n, " +
                                std::to_string(head_dim_) + "], found " + c10::str(k.sizes()) +
                                " and " + c10::str(v.sizes()));
  const int64_t n = k.size(2), longest = length();
  if (longest + n > capacity_)
    throw std::out_of_range("KvCache: " + std::to_string(longest) + " cached + " +
                            std::to_string(n) + " new positions exceed the capacity " +
                            std::to_string(capacity_));
  const bool all = all_selected();
  if (all && one_length()) {
    keys_[index].narrow(2, longest, n).copy_(k);
    values_[index].narrow(2, longest, n).copy_(v);
  } else {
    for (size_t i = 0; i < selected_.size(); ++i) {
      const int64_t r = selected_[i], at = lengths_[static_cast<size_t>(r)];
      keys_[index].select(0, r).narrow(1, at, n).copy_(k.select(0, static_cast<int64_t>(i)));
      values_[index].select(0, r).narrow(1, at, n).copy_(v.select(0, static_cast<int64_t>(i)));
    }
  }
  at::Tensor keys = keys_[index].narrow(2, 0, longest + n);
  at::Tensor values = values_[index].narrow(2, 0, longest + n);
  if (all) return {keys, values};
  const at::Tensor rows = at::tensor(selected_, at::TensorOptions().dtype(at::kLong).device(keys.device()));
  return {keys.index_select(0, rows), values.index_select(0, rows)};
}

void KvCache::advance(int64_t n) {
  const int64_t longest = length();
  if (n < 0 || longest + n > capacity_)
    throw std::out_of_range("KvCache: cannot advance " + std::to_string(n) + " positions from " +
                            std::to_string(longest) + " (capacity " + std::to_string(capacity_) +
                            ")");
  for (int64_t r : selected_) lengths_[static_cast<size_t>(r)] += n;
}

}  // namespace loom::model
