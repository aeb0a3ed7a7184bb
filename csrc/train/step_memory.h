// Device memory of each training step for metrics.jsonl (docs/design/conventions.md, "Logs and
// metrics"): per step, the peak bytes allocated from the step's start to its end and the bytes
// still allocated after it (what torch.cuda.max_memory_allocated / memory_allocated report
// with a reset per step; and the allocator's reserved peak, torch.cuda.max_memory_reserved),
// from the device's caching allocator (runtime/run_device.h), reduced
// over the ranks of each pipeline stage, so that the planner's per-stage prediction can be
// checked against it (docs/planner.md, "Memory").
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/process_groups.h"

namespace loom::train {

/// One step on this rank, in bytes.
struct StepMemory {
  int64_t peak = 0;        ///< the most allocated at once during the step
  int64_t after_step = 0;  ///< allocated when the step (optimizer included) was done
  int64_t reserved_peak = 0;  ///< the most the caching allocator held during the step
};

/// The memory fields of a batch of step records.
class StepMemoryRecords {
 public:
  /// `steps`: this rank's figures for each record (nullopt where the device keeps no
  /// statistics: CPU ranks); `run_peak`: this rank's peak since the process started. With
  /// `collective`, a MAX all-reduce over groups.host_world() (every rank calls it with as many
  /// steps); without, this rank's figures only (an error path, where peers may be gone).
  StepMemoryRecords(const std::vector<std::optional<StepMemory>>& steps, int64_t run_peak,
                    runtime::ProcessGroups& groups, bool collective);

  /// Adds to record `i`: mem_peak_bytes, mem_after_step_bytes and mem_reserved_peak_bytes (the
  /// largest rank's), mem_peak_bytes_by_stage, mem_after_step_bytes_by_stage and
  /// mem_reserved_peak_bytes_by_stage (one entry per pipeline stage, its largest rank's; only
  /// with `collective`), and peak_device_memory_mib (the largest rank's peak since its process
  /// started). Nothing on CPU ranks.
  void write(size_t i, nlohmann::json& record) const;

 private:
  bool present_ = false;
  bool by_stage_ = false;
  int stages_ = 1;
  std::vector<int64_t> values_;  ///< [stages][steps][peak, after_step, reserved_peak], then the run's peak
  size_t steps_ = 0;
};

}  // namespace loom::train
