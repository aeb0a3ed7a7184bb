#include "model/kv_cache.h"

#include <ATen/ATen.h>
#include <ATen/TensorIndexing.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "loom_ops/ops.h"
#include "loom_ops/paged_attention.h"

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

KvCache KvCache::paged(int first_layer, int num_layers, int64_t rows, int64_t num_blocks,
                       int64_t block_size, int64_t kv_heads_local, int64_t head_dim,
                       const at::TensorOptions& options) {
  if (num_layers < 0 || rows < 1 || num_blocks < 1 || block_size < 1 || kv_heads_local < 1 || head_dim < 1)
    throw std::invalid_argument(
        "KvCache::paged: expected num_layers >= 0 and positive rows, num_blocks, block_size, kv heads and "
        "head_dim, found " + std::to_string(num_layers) + " layers, " + std::to_string(rows) + " rows, " +
        std::to_string(num_blocks) + " blocks of " + std::to_string(block_size) + ", kv heads " +
        std::to_string(kv_heads_local) + ", head_dim " + std::to_string(head_dim));
  KvCache c;
  c.first_layer_ = first_layer;
  c.batch_ = rows;
  c.heads_local_ = kv_heads_local;
  c.head_dim_ = head_dim;
  c.block_size_ = block_size;
  c.num_blocks_ = num_blocks;
  c.capacity_ = num_blocks * block_size;
  c.lengths_.assign(static_cast<size_t>(rows), 0);
  c.tables_.assign(static_cast<size_t>(rows), {});
  for (int64_t r = 0; r < rows; ++r) c.selected_.push_back(r);
  for (int i = 0; i < num_layers; ++i) {
    c.keys_.push_back(at::zeros({num_blocks, kv_heads_local, block_size, head_dim}, options));
    c.values_.push_back(at::zeros({num_blocks, kv_heads_local, block_size, head_dim}, options));
  }
  return c;
}

void KvCache::set_row(int64_t row, std::vector<int64_t> blocks, int64_t length) {
  if (!is_paged()) throw std::logic_error("KvCache::set_row: the cache is not paged");
  if (row < 0 || row >= batch_)
    throw std::out_of_range("KvCache::set_row: row " + std::to_string(row) + " is outside [0, " +
                            std::to_string(batch_) + ")");
  for (int64_t b : blocks)
    if (b < 0 || b >= num_blocks_)
      throw std::out_of_range("KvCache::set_row: block " + std::to_string(b) + " is outside [0, " +
                              std::to_string(num_blocks_) + ")");
  if (length < 0 || length > static_cast<int64_t>(blocks.size()) * block_size_)
    throw std::out_of_range("KvCache::set_row: " + std::to_string(length) + " positions do not fit in " +
                            std::to_string(blocks.size()) + " blocks of " + std::to_string(block_size_));
  tables_[static_cast<size_t>(row)] = std::move(blocks);
  lengths_[static_cast<size_t>(row)] = length;
  paged_index_.n = -1;
}

std::pair<at::Tensor, at::Tensor> KvCache::layer_storage(int layer) const {
  const int index = index_of(layer);
  return {keys_[static_cast<size_t>(index)], values_[static_cast<size_t>(index)]};
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
  counts_.clear();
  paged_index_.n = -1;
  if (selected_.empty())
    for (int64_t r = 0; r < batch_; ++r) selected_.push_back(r);
}

void KvCache::select_flat(const std::vector<int64_t>& rows, const std::vector<int64_t>& counts) {
  if (!is_paged()) throw std::logic_error("KvCache::select_flat: the cache is not paged");
  if (rows.empty() || rows.size() != counts.size())
    throw std::out_of_range("KvCache::select_flat: expected one count per row and at least one row, found " +
                            std::to_string(rows.size()) + " rows and " + std::to_string(counts.size()) + " counts");
  for (int64_t c : counts)
    if (c < 0) throw std::out_of_range("KvCache::select_flat: a row's count of new positions is " + std::to_string(c));
  select_rows(rows);
  counts_ = counts;
}

int64_t KvCache::end_position(int64_t n) const {
  int64_t end = 0;
  for (size_t i = 0; i < selected_.size(); ++i)
    end = std::max(end, lengths_[static_cast<size_t>(selected_[i])] + new_count(i, n));
  return end;
}

void KvCache::check_flat_total(int64_t n, const char* what) const {
  if (counts_.empty()) return;
  int64_t total = 0;
  for (int64_t c : counts_) total += c;
  if (n != total)
    throw std::invalid_argument(std::string("KvCache::") + what + ": the flat batch holds " + std::to_string(total) +
                                " new positions, not " + std::to_string(n));
}

void KvCache::reset() {
  std::fill(lengths_.begin(), lengths_.end(), 0);
  select_rows({});
}

void KvCache::use_static_index(const StaticIndex* index) {
  if (!is_paged()) throw std::logic_error("KvCache::use_static_index: the cache is not paged");
  static_index_ = index;
}

at::Tensor KvCache::positions(int64_t n, const at::TensorOptions& options) const {
  if (static_index_ != nullptr) {
    if (static_index_->positions.size(1) != n)
      throw std::invalid_argument("KvCache::positions: the static index holds " +
                                  std::to_string(static_index_->positions.size(1)) + " positions, not " +
                                  std::to_string(n));
    return static_index_->positions;
  }
  if (is_flat()) {
    check_flat_total(n, "positions");
    std::vector<int64_t> flat;
    for (size_t i = 0; i < selected_.size(); ++i)
      for (int64_t k = 0; k < counts_[i]; ++k) flat.push_back(lengths_[static_cast<size_t>(selected_[i])] + k);
    return at::tensor(flat, options.dtype(at::kLong)).view({1, n});
  }
  std::vector<int64_t> start;
  for (int64_t r : selected_) start.push_back(lengths_[static_cast<size_t>(r)]);
  const auto long_options = options.dtype(at::kLong);
  return at::tensor(start, long_options).unsqueeze(1) + at::arange(n, long_options).unsqueeze(0);  // [b, n]
}

std::optional<at::Tensor> KvCache::attention_mask(int64_t n, const at::Device& device) const {
  if (is_flat()) throw std::logic_error("KvCache::attention_mask: the flat form reads the cache through paged_attention");
  if (one_length()) return std::nullopt;
  const auto long_options = at::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor last_visible = positions(n, long_options).view({batch(), 1, n, 1});   // query i of row r
  const at::Tensor keys = at::arange(length() + n, long_options).view({1, 1, 1, length() + n});
  return keys > last_visible;  // [b, 1, n, L + n] bool
}

int KvCache::index_of(int layer) const {
  const int index = layer - first_layer_;
  if (index < 0 || index >= static_cast<int>(keys_.size()))
    throw std::out_of_range("KvCache: layer " + std::to_string(layer) +
                            " is not cached here (layers " + std::to_string(first_layer_) + ".." +
                            std::to_string(first_layer_ + static_cast<int>(keys_.size()) - 1) + ")");
  return index;
}

void KvCache::check_new(const at::Tensor& k, const at::Tensor& v) const {
  if (k.dim() != 4 || k.size(0) != batch() || k.size(1) != heads_local_ || k.size(3) != head_dim_ ||
      v.sizes() != k.sizes())
    throw std::invalid_argument("KvCache: expected keys and values [" + std::to_string(batch()) +
                                ", " + std::to_string(heads_local_) + ", n, " +
                                std::to_string(head_dim_) + "], found " + c10::str(k.sizes()) +
                                " and " + c10::str(v.sizes()));
}

std::pair<at::Tensor, at::Tensor> KvCache::append(int layer, const at::Tensor& k,
                                                  const at::Tensor& v) {
  if (is_paged()) throw std::logic_error("KvCache::append: a paged cache is read through attend()");
  const int index = index_of(layer);
  check_new(k, v);
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

const KvCache::PagedIndex& KvCache::paged_index(int64_t n, const at::Device& device) {
  if (paged_index_.n == n && paged_index_.blocks.device() == device) return paged_index_;
  check_flat_total(n, "attend");
  std::vector<int64_t> blocks, offsets, lengths, starts{0};
  size_t widest = 1;
  for (int64_t r : selected_) widest = std::max(widest, tables_[static_cast<size_t>(r)].size());
  std::vector<int64_t> tables(selected_.size() * widest, 0);  // padding is never read
  for (size_t i = 0; i < selected_.size(); ++i) {
    const auto& table = tables_[static_cast<size_t>(selected_[i])];
    const int64_t length = lengths_[static_cast<size_t>(selected_[i])], count = new_count(i, n);
    if (length + count > static_cast<int64_t>(table.size()) * block_size_)
      throw std::out_of_range("KvCache: row " + std::to_string(selected_[i]) + " holds " + std::to_string(length) +
                              " positions and has room for " +
                              std::to_string(static_cast<int64_t>(table.size()) * block_size_) + ", not " +
                              std::to_string(count) + " more");
    for (int64_t t = length; t < length + count; ++t) {
      blocks.push_back(table[static_cast<size_t>(t / block_size_)]);
      offsets.push_back(t % block_size_);
    }
    std::copy(table.begin(), table.end(), tables.begin() + static_cast<int64_t>(i * widest));
    lengths.push_back(length + count);
    starts.push_back(starts.back() + count);
  }
  const auto long_options = at::TensorOptions().dtype(at::kLong).device(device);
  const int64_t b = static_cast<int64_t>(selected_.size());
  paged_index_.blocks = at::tensor(blocks, long_options);
  paged_index_.offsets = at::tensor(offsets, long_options);
  paged_index_.tables = at::tensor(tables, long_options).view({b, static_cast<int64_t>(widest)});
  paged_index_.lengths = at::tensor(lengths, long_options);
  paged_index_.starts = is_flat() ? at::tensor(starts, long_options) : at::Tensor();
  paged_index_.n = n;
  return paged_index_;
}

at::Tensor expand_kv_heads(const at::Tensor& kv, int64_t heads) {
  const int64_t b = kv.size(0), g = kv.size(1), s = kv.size(2), d = kv.size(3);
  if (heads == g) return kv;
  if (heads % g != 0)
    throw std::invalid_argument("expand_kv_heads: " + std::to_string(heads) + " query heads are not a multiple of " +
                                std::to_string(g) + " key/value heads");
  return kv.unsqueeze(2).expand({b, g, heads / g, s, d}).reshape({b, heads, s, d});
}

at::Tensor KvCache::attend(int layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           double scale) {
  const int64_t n = k.size(2);
  if (!is_paged()) {
    auto [keys, values] = append(layer, k, v);  // [b, kv heads, L + n, d]
    keys = expand_kv_heads(keys, q.size(1));      // grouped-query attention: [b, heads, L + n, d]
    values = expand_kv_heads(values, q.size(1));
    at::Tensor scores = at::matmul(q, keys.transpose(-2, -1));  // [b, heads, n, L + n]
    // Rows of one length L: causal with sq = n < sk = L + n (query i, at position L + i, sees
    // keys j <= L + i). Rows of different lengths: the per-row mask says the same.
    const std::optional<at::Tensor> mask = attention_mask(n, scores.device());
    at::Tensor probs = ops::scaled_masked_softmax(scores, mask, scale, /*causal=*/!mask.has_value());
    return at::matmul(probs, values);
  }
  const int index = index_of(layer);
  check_new(k, v);
  // The slots and tables: the caller's fixed buffers (decode graphs), else made from the rows.
  const at::Tensor *blocks, *offsets, *tables, *lengths, *query_starts;
  if (static_index_ != nullptr) {
    if (static_index_->blocks.size(0) != k.size(0) * n)
      throw std::invalid_argument("KvCache::attend: the static index holds " +
                                  std::to_string(static_index_->blocks.size(0)) + " slots, not " +
                                  std::to_string(k.size(0) * n));
    blocks = &static_index_->blocks, offsets = &static_index_->offsets, tables = &static_index_->tables;
    lengths = &static_index_->lengths, query_starts = &static_index_->starts;
  } else {
    const PagedIndex& at_slots = paged_index(n, k.device());
    blocks = &at_slots.blocks, offsets = &at_slots.offsets, tables = &at_slots.tables;
    lengths = &at_slots.lengths, query_starts = &at_slots.starts;
  }
  using at::indexing::Slice;
  // [b, kv, n, d] -> [b·n, kv, d], one row per slot, in the order of the slot lists (flat: b = 1
  // and the slots run row after row, as the positions do).
  const int64_t rows = k.size(0) * n;
  keys_[index].index_put_({*blocks, Slice(), *offsets}, k.permute({0, 2, 1, 3}).reshape({rows, heads_local_, head_dim_}));
  values_[index].index_put_({*blocks, Slice(), *offsets},
                            v.permute({0, 2, 1, 3}).reshape({rows, heads_local_, head_dim_}));
  const std::optional<at::Tensor> starts =
      query_starts->defined() ? std::optional<at::Tensor>(*query_starts) : std::nullopt;
  return ops::paged_attention(q, keys_[index], values_[index], *tables, *lengths, scale, starts);
}

void KvCache::advance(int64_t n) {
  paged_index_.n = -1;
  if (static_index_ != nullptr) return;  // the caller commits the real rows (use_static_index)
  if (is_paged()) {
    check_flat_total(n, "advance");
    for (size_t i = 0; i < selected_.size(); ++i) {
      const int64_t r = selected_[i], count = new_count(i, n);
      const int64_t room = static_cast<int64_t>(tables_[static_cast<size_t>(r)].size()) * block_size_;
      if (count < 0 || lengths_[static_cast<size_t>(r)] + count > room)
        throw std::out_of_range("KvCache: cannot advance row " + std::to_string(r) + " by " + std::to_string(count) +
                                " positions from " + std::to_string(lengths_[static_cast<size_t>(r)]) +
                                " (its blocks hold " + std::to_string(room) + ")");
    }
    for (size_t i = 0; i < selected_.size(); ++i) lengths_[static_cast<size_t>(selected_[i])] += new_count(i, n);
    return;
  }
  const int64_t longest = length();
  if (n < 0 || longest + n > capacity_)
    throw std::out_of_range("KvCache: cannot advance " + std::to_string(n) + " positions from " +
                            std::to_string(longest) + " (capacity " + std::to_string(capacity_) +
                            ")");
  for (int64_t r : selected_) lengths_[static_cast<size_t>(r)] += n;
}

}  // namespace loom::model
