#include "prompt_data/sequence_packing.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace loom::prompt_data {

double SequencePacking::efficiency() const {
  return packs.empty() ? 0.0 : static_cast<double>(filled) / (static_cast<double>(packs.size()) * capacity);
}

namespace {

// The rows' free positions in a max segment tree over row slots, so "the first row with room
// for n" is one descent: first fit in O(log rows) per example instead of a scan of every row.
class FirstFitRows {
 public:
  explicit FirstFitRows(int64_t slots) {
    while (size_ < slots) size_ *= 2;
    free_.assign(2 * size_, -1);  // -1: no row in this slot yet
  }
  /// The first row (in opening order) with at least n free positions, or -1.
  int64_t first_with(int64_t n) const {
    if (free_[1] < n) return -1;
    int64_t node = 1;
    while (node < size_) node = free_[2 * node] >= n ? 2 * node : 2 * node + 1;
    return node - size_;
  }
  void set(int64_t row, int64_t free) {
    int64_t node = row + size_;
    free_[node] = free;
    for (node /= 2; node >= 1; node /= 2) free_[node] = std::max(free_[2 * node], free_[2 * node + 1]);
  }
  int64_t free(int64_t row) const { return free_[row + size_]; }

 private:
  int64_t size_ = 1;
  std::vector<int64_t> free_;
};

}  // namespace

SequencePacking first_fit_decreasing(const std::vector<int64_t>& lengths, int64_t capacity) {
  if (capacity < 1) throw std::invalid_argument(fmt::format("packing capacity must be >= 1, found {}", capacity));
  for (size_t i = 0; i < lengths.size(); ++i)
    if (lengths[i] < 1 || lengths[i] > capacity)
      throw std::invalid_argument(fmt::format("example {} has {} input positions; a packed row holds 1 to {}", i,
                                              lengths[i], capacity));
  std::vector<int64_t> order(lengths.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });

  SequencePacking out;
  out.capacity = capacity;
  FirstFitRows rows(std::max<int64_t>(1, static_cast<int64_t>(lengths.size())));
  for (const int64_t i : order) {
    int64_t row = rows.first_with(lengths[i]);
    if (row < 0) {
      row = static_cast<int64_t>(out.packs.size());
      out.packs.emplace_back();
      rows.set(row, capacity);
    }
    out.packs[row].push_back(i);
    rows.set(row, rows.free(row) - lengths[i]);
    out.filled += lengths[i];
  }
  return out;
}

PackedRows make_packed_rows(const std::vector<const PromptExample*>& examples,
                            const std::vector<std::vector<int64_t>>& packs, int64_t capacity,
                            const std::vector<ParsedTemplate>& templates, int64_t pad_id) {
  PackedRows out;
  out.rows = static_cast<int64_t>(packs.size());
  out.seq_length = capacity;
  const size_t cells = static_cast<size_t>(out.rows * capacity);
  out.tokens.assign(cells, pad_id);
  out.labels.assign(cells, pad_id);
  out.loss_mask.assign(cells, 0.0f);
  out.position_ids.assign(cells, 0);
  for (int64_t r = 0; r < out.rows; ++r) {
    std::vector<int64_t> starts = {0};
    for (const int64_t i : packs[r]) {
      if (i < 0 || i >= static_cast<int64_t>(examples.size()))
        throw std::invalid_argument(fmt::format("packed row {} names example {} of {}", r, i, examples.size()));
      if (std::find(examples[i]->is_virtual.begin(), examples[i]->is_virtual.end(), 1) != examples[i]->is_virtual.end())
        throw std::invalid_argument(fmt::format("example {} has virtual tokens: packed rows hold examples without them", i));
      const int64_t n = examples[i]->size() - 1;  // input positions
      if (n < 1)
        throw std::invalid_argument(fmt::format("example {} has {} token(s); a packed example needs at least 2", i,
                                                examples[i]->size()));
      const int64_t at = starts.back();
      if (at + n > capacity)
        throw std::invalid_argument(fmt::format("packed row {}'s examples need more than its {} positions", r, capacity));
      // The example's own unpacked row (the one rule for labels and loss), cut to its positions.
      const PromptBatch own = make_prompt_batch({examples[i]}, templates, n, pad_id);
      const size_t base = static_cast<size_t>(r * capacity + at);
      std::copy(own.tokens.begin(), own.tokens.end(), out.tokens.begin() + base);
      std::copy(own.labels.begin(), own.labels.end(), out.labels.begin() + base);
      std::copy(own.loss_mask.begin(), own.loss_mask.end(), out.loss_mask.begin() + base);
      std::iota(out.position_ids.begin() + base, out.position_ids.begin() + base + n, 0);
      starts.push_back(at + n);
    }
    out.segment_starts.push_back(std::move(starts));
  }
  return out;
}

}  // namespace loom::prompt_data
