#include "train/step_memory.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace loom::train {
namespace {
constexpr size_t kFields = 3;  // peak, after_step, reserved_peak
}  // namespace

StepMemoryRecords::StepMemoryRecords(const std::vector<std::optional<StepMemory>>& steps, int64_t run_peak,
                                     runtime::ProcessGroups& groups, bool collective)
    : steps_(steps.size()) {
  // Every rank of a run has the same kind of device, so all of them take this branch or none.
  present_ = !steps.empty() && steps.front().has_value();
  if (!present_) return;
  by_stage_ = collective;
  stages_ = collective ? groups.layout().pipeline_parallel() : 1;
  const int stage = collective ? groups.coords().pp : 0;
  values_.assign(size_t(stages_) * steps_ * kFields + 1, 0);
  for (size_t i = 0; i < steps_; ++i) {
    const StepMemory m = steps[i].value_or(StepMemory{});
    int64_t* at = &values_[(size_t(stage) * steps_ + i) * kFields];
    at[0] = m.peak;
    at[1] = m.after_step;
    at[2] = m.reserved_peak;
  }
  values_.back() = run_peak;
  if (!collective) return;
  // host: allocator statistics are host values; reduced on the host group.
  at::Tensor all = at::tensor(values_, at::kLong);
  groups.host_world().all_reduce(all, runtime::ReduceOp::kMax);
  std::copy_n(all.data_ptr<int64_t>(), values_.size(), values_.begin());
}

void StepMemoryRecords::write(size_t i, nlohmann::json& record) const {
  if (!present_) return;
  int64_t peak = 0, after = 0, reserved = 0;
  std::vector<int64_t> peak_by_stage, after_by_stage, reserved_by_stage;
  for (int s = 0; s < stages_; ++s) {
    const int64_t* at = &values_[(size_t(s) * steps_ + i) * kFields];
    peak = std::max(peak, at[0]);
    after = std::max(after, at[1]);
    reserved = std::max(reserved, at[2]);
    peak_by_stage.push_back(at[0]);
    after_by_stage.push_back(at[1]);
    reserved_by_stage.push_back(at[2]);
  }
  record["mem_peak_bytes"] = peak;
  record["mem_after_step_bytes"] = after;
  record["mem_reserved_peak_bytes"] = reserved;
  if (by_stage_) {
    record["mem_peak_bytes_by_stage"] = peak_by_stage;
    record["mem_after_step_bytes_by_stage"] = after_by_stage;
    record["mem_reserved_peak_bytes_by_stage"] = reserved_by_stage;
  }
  record["peak_device_memory_mib"] = double(values_.back()) / (1024.0 * 1024.0);
}

}  // namespace loom::train
