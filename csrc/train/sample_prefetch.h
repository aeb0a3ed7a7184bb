// model.data.num_workers, as Loom gives it effect: that many background threads read the next
// training step's samples while the current step computes (Lightning's DataLoader workers with
// a prefetch of one step). 0 reads on the training thread when the step asks. Either way a
// step gets exactly the samples its ids name, so the losses do not depend on num_workers
// (docs/design/conventions.md, "Recipes").
#pragma once
#include <cstdint>
#include <future>
#include <vector>

#include "data/sample_dataset.h"

namespace loom::train {

/// Sample ids of one step on this rank: one list per micro-batch.
using StepSampleIds = std::vector<std::vector<int64_t>>;
/// The samples those ids name, in the same order.
using StepSamples = std::vector<std::vector<data::GptSample>>;

/// Reads the samples of `ids` from `dataset`, spreading the micro-batches over `threads`
/// threads (≤ 1: on this one). Rethrows the first read error (std::out_of_range for an id
/// outside the dataset).
StepSamples read_step_samples(const data::SampleDataset& dataset, const StepSampleIds& ids, int64_t threads);

class SamplePrefetcher {
 public:
  /// `dataset` must outlive the prefetcher and be safe to read from several threads
  /// (data::SampleDataset::get is). Throws std::invalid_argument for num_workers < 0.
  SamplePrefetcher(const data::SampleDataset& dataset, int64_t num_workers);
  ~SamplePrefetcher();  // waits for a read in flight

  /// The samples of `ids`: those read ahead when `ids` is what prefetch() was given, else read
  /// now. Rethrows a read's error (e.g. std::out_of_range for an id outside the dataset).
  StepSamples take(const StepSampleIds& ids);
  /// Starts reading `ids` in the background (no-op with 0 workers).
  void prefetch(StepSampleIds ids);

 private:
  const data::SampleDataset& dataset_;
  int64_t workers_;
  StepSampleIds pending_ids_;
  std::future<StepSamples> pending_;
};

}  // namespace loom::train
