#include "data/pretraining_sampler.h"

#include <algorithm>
#include <string>

#include "data/data_error.h"

namespace loom::data {

PretrainingSampler::PretrainingSampler(int64_t total, int64_t consumed, int64_t micro, int64_t rank, int64_t size,
                                       bool drop_last)
    : total_(total), position_(consumed), micro_(micro), rank_(rank), size_(size), drop_last_(drop_last) {
  auto bad = [](const std::string& m) { return DataError("pretraining sampler: " + m); };
  if (total <= 0) throw bad("no sample to consume (total_samples = " + std::to_string(total) + ")");
  if (consumed < 0 || consumed >= total)
    throw bad("consumed_samples " + std::to_string(consumed) + " is not below total_samples " + std::to_string(total));
  if (micro <= 0) throw bad("micro_batch_size must be positive, got " + std::to_string(micro));
  if (size <= 0) throw bad("data-parallel size must be positive, got " + std::to_string(size));
  if (rank < 0 || rank >= size)
    throw bad("data-parallel rank " + std::to_string(rank) + " outside [0, " + std::to_string(size) + ")");
}

std::optional<std::vector<int64_t>> PretrainingSampler::next() {
  const int64_t step = micro_ * size_;
  const int64_t avail = total_ - position_;
  if (avail <= 0 || (avail < step && drop_last_)) return std::nullopt;
  const int64_t n = std::min(step, avail);
  std::vector<int64_t> ids;
  for (int64_t i = rank_ * micro_; i < std::min(n, (rank_ + 1) * micro_); ++i) ids.push_back(position_ + i);
  position_ += n;
  return ids;
}

}  // namespace loom::data
