// The per-step training records of metrics.jsonl, read from the device in batches: a step's
// loss stays a device tensor until the next flush (every trainer.log_every_n_steps steps, and
// before validation, checkpoints and the end of the run), where one host sync reads every
// pending loss (docs/design/devices.md: .item() waits for the device, so it stays out of the
// step loop). Every rank keeps and flushes the same steps, so a non-finite loss stops all ranks
// at once, at the flush that reads it (the updates of such steps were already skipped by the
// optimizer: its gradient norm is non-finite too); only the rank given a MetricsLog writes.
// The optimizer's gradient norm, skip flag and loss scale are device tensors too, read in the
// same copy. With a device plugin that counts host waits (the stand-in), each record carries
// `host_waits`: how often the step itself waited for the device (0 between flushes).
#pragma once
#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/process_groups.h"
#include "train/metrics_log.h"
#include "train/optim/optimizer.h"
#include "train/step_memory.h"

namespace loom::train {

/// What a record needs beyond the step's own values.
struct StepLogConfig {
  int64_t max_steps = 1;
  int64_t print_every = 1;         ///< trainer.log_every_n_steps (also the flush interval)
  int64_t tokens_per_step = 1;     ///< global batch × sequence length
  double model_flops_per_step = 0;  ///< train::model_flops_per_step (model_setup.h)
  int world_size = 1;
  std::optional<double> peak_tflops;  ///< the device's (planner::peak_tflops_for_device), for MFU; none on CPUs
  /// trainer.max_time in seconds: records then carry max_time_left_s (measured from when the
  /// log was made, so slightly less than the step loop's own clock allows).
  std::optional<double> max_time_s;
};

class StepLog {
 public:
  /// `log`: rank 0's metrics log, null elsewhere.
  StepLog(StepLogConfig config, runtime::ProcessGroups& groups, MetricsLog* log);

  /// Marks the start of a step (for its host_waits count).
  void begin_step();
  /// Records step `step` (1-based, done) with its device loss and the optimizer's result;
  /// `seconds` is the host time of the step itself (data, forward, backward, optimizer).
  /// Flushes when `step` is a multiple of print_every, the first or the last (max_steps) step;
  /// those steps are the ones printed.
  void add(int64_t step, at::Tensor loss, const optim::StepResult& result, double lr,
           double seconds, int64_t consumed_samples);
  /// Writes every pending record (one device sync). Collective over host_world (the largest
  /// rank's peak device memory) unless `collective` is false (an error path: this rank's
  /// records only, so that a crash loses none). Throws std::runtime_error naming the step when
  /// a loss is not finite.
  void flush(bool collective = true);
  /// On a rank's error path: flush(false), swallowing any error (the error being reported
  /// matters more), so that a run that fails keeps the losses of the steps it did.
  void keep_unflushed_steps() noexcept;
  /// The loss of the last flushed step (NaN before any).
  double last_loss() const { return last_loss_; }

 private:
  struct Pending {
    int64_t step;
    at::Tensor loss;
    optim::StepResult result;
    double lr, seconds;
    int64_t consumed_samples;
    double elapsed;  ///< seconds since the log was made, when the step was added
    double eta;      ///< seconds to max_steps at the mean step time so far
    std::optional<int64_t> host_waits;  ///< waits from begin_step() to add(), when counted
    std::optional<StepMemory> memory;   ///< this rank's, where the device keeps statistics
  };
  StepLogConfig config_;
  runtime::ProcessGroups& groups_;
  MetricsLog* log_;
  std::vector<Pending> pending_;
  double last_loss_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  double seconds_timed_ = 0;  ///< host seconds of the steps added so far (for the ETA)
  int64_t steps_timed_ = 0;
  std::optional<int64_t> waits_at_step_start_;
  int64_t run_peak_bytes_ = 0;  ///< device peak before the current step's reset
};

}  // namespace loom::train
