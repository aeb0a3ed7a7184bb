#include "train/sample_prefetch.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <thread>

namespace loom::train {

SamplePrefetcher::SamplePrefetcher(const data::SampleDataset& dataset, int64_t num_workers)
    : dataset_(dataset), workers_(num_workers) {
  if (num_workers < 0) throw std::invalid_argument("model.data.num_workers must be >= 0, got " + std::to_string(num_workers));
}

SamplePrefetcher::~SamplePrefetcher() {
  if (pending_.valid()) pending_.wait();
}

StepSamples read_step_samples(const data::SampleDataset& dataset, const StepSampleIds& ids, int64_t threads) {
  StepSamples out(ids.size());
  auto read_micro_batches = [&](size_t first, size_t stride) {
    for (size_t k = first; k < ids.size(); k += stride) {
      out[k].reserve(ids[k].size());
      for (int64_t id : ids[k]) out[k].push_back(dataset.get(id));
    }
  };
  const size_t n = std::min<size_t>(std::max<int64_t>(threads, 1), ids.size());
  if (n <= 1) {
    read_micro_batches(0, 1);
    return out;
  }
  // Worker w reads every n-th micro-batch from the w-th; the first error is rethrown once all end.
  std::vector<std::future<void>> parts;
  for (size_t w = 0; w < n; ++w) parts.push_back(std::async(std::launch::async, read_micro_batches, w, n));
  for (auto& part : parts) part.wait();
  for (auto& part : parts) part.get();
  return out;
}

StepSamples SamplePrefetcher::take(const StepSampleIds& ids) {
  if (pending_.valid()) {
    if (pending_ids_ == ids) return pending_.get();  // rethrows the background read's error
    pending_.wait();  // read ahead for other ids (the data was exhausted): not this step's
    pending_ = {};
  }
  return read_step_samples(dataset_, ids, 1);
}

void SamplePrefetcher::prefetch(StepSampleIds ids) {
  if (workers_ == 0) return;
  if (pending_.valid()) pending_.wait();
  pending_ids_ = std::move(ids);
  pending_ = std::async(std::launch::async, [this] { return read_step_samples(dataset_, pending_ids_, workers_); });
}

}  // namespace loom::train
