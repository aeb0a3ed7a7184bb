#include "train/step_log.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <sys/resource.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "runlog/progress_line.h"
#include "runtime/run_device.h"
#include "train/step_memory.h"

namespace loom::train {
namespace {

double max_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;
}

// The first step, every `every`-th and the last (so a run shorter than the interval still shows
// how it ended).
bool printed_step(int64_t step, int64_t every, int64_t last) {
  return step % std::max<int64_t>(1, every) == 0 || step == 1 || step == last;
}

}  // namespace

StepLog::StepLog(StepLogConfig config, runtime::ProcessGroups& groups, MetricsLog* log)
    : config_(config), groups_(groups), log_(log), last_loss_(NAN) {}

void StepLog::begin_step() {
  waits_at_step_start_ = runtime::device_host_waits();
  // Each step's peak is measured from its own start; the run's peak so far keeps the earlier ones.
  if (const auto memory = runtime::device_memory_bytes(groups_.device())) {
    run_peak_bytes_ = std::max(run_peak_bytes_, memory->peak);
    runtime::reset_peak_device_memory(groups_.device());
  }
}

void StepLog::add(int64_t step, at::Tensor loss, const optim::StepResult& result, double lr,
                  double seconds, int64_t consumed_samples) {
  std::optional<int64_t> waits;
  if (const auto now = runtime::device_host_waits(); now && waits_at_step_start_) waits = *now - *waits_at_step_start_;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  seconds_timed_ += seconds;
  ++steps_timed_;
  // The ETA counts training steps only (validation and saves excluded), at their mean time.
  const double eta = seconds_timed_ / double(steps_timed_) * double(std::max<int64_t>(0, config_.max_steps - step));
  std::optional<StepMemory> memory;
  if (const auto now = runtime::device_memory_bytes(groups_.device()))
    memory = StepMemory{now->peak, now->allocated, now->reserved_peak};
  pending_.push_back({step, std::move(loss), result, lr, seconds, consumed_samples, elapsed, eta, waits, memory});
  if (printed_step(step, config_.print_every, config_.max_steps)) {
    flush();
  } else if (log_) {
    const std::string loss_text =
        std::isnan(last_loss_) ? "" : fmt::format(" | loss {:.4f} (step {})", last_loss_,
                                                  step - int64_t(pending_.size()));
    log_->progress(fmt::format("step {}/{}{} | elapsed {} | ETA {}", step, config_.max_steps, loss_text,
                               runlog::format_duration(elapsed), runlog::format_duration(eta)));
  }
}

void StepLog::keep_unflushed_steps() noexcept {
  try {
    flush(/*collective=*/false);
  } catch (...) {
  }
}

void StepLog::flush(bool collective) {
  if (pending_.empty()) return;
  // [pending, 5]: every pending step's loss, then its StepResult::values(), in one copy.
  constexpr int64_t kColumns = 5;
  std::vector<at::Tensor> rows;
  for (const auto& p : pending_) rows.push_back(at::cat({p.loss.reshape({1}).to(at::kDouble), p.result.values()}));
  const at::Tensor host = at::stack(rows).to(at::kCPU).contiguous();  // the one sync
  const double* values = host.data_ptr<double>();
  const double rss = max_rss_mib();
  std::vector<Pending> done;
  done.swap(pending_);
  std::vector<std::optional<StepMemory>> step_memory;
  for (const auto& p : done) step_memory.push_back(p.memory);
  // The run's peak so far includes what was allocated since the last step ended.
  int64_t run_peak = run_peak_bytes_;
  if (const auto now = runtime::device_memory_bytes(groups_.device())) run_peak = std::max(run_peak, now->peak);
  const StepMemoryRecords memory(step_memory, run_peak, groups_, collective);
  for (size_t i = 0; i < done.size(); ++i) {
    const auto& p = done[i];
    const double* v = values + kColumns * i;
    const double loss = v[0];
    if (log_) {
      const double tflops = config_.model_flops_per_step / p.seconds / config_.world_size / 1e12;
      nlohmann::json rec = {{"kind", "train"},
                            {"step", p.step},
                            {"max_steps", config_.max_steps},
                            {"loss", loss},
                            {"lr", p.lr},
                            {"grad_norm", float(v[1])},
                            {"grad_sync_s", p.result.grad_sync_s},
                            {"loss_scale", v[4]},
                            {"skipped", v[2] != 0.0},
                            {"step_time_s", p.seconds},
                            // wall clock since training began: throughput over many steps
                            // includes what a step leaves queued on the device
                            {"elapsed_s", p.elapsed},
                            {"eta_s", p.eta},
                            {"tokens_per_s", double(config_.tokens_per_step) / p.seconds},
                            {"model_tflops_per_device", tflops},
                            {"consumed_samples", p.consumed_samples},
                            {"max_rss_mib", rss}};
      memory.write(i, rec);
      if (p.host_waits) rec["host_waits"] = *p.host_waits;
      if (config_.peak_tflops) rec["mfu"] = tflops / *config_.peak_tflops;
      if (config_.max_time_s) rec["max_time_left_s"] = std::max(0.0, *config_.max_time_s - p.elapsed);
      log_->write(rec, printed_step(p.step, config_.print_every, config_.max_steps));
    }
    if (!std::isfinite(loss))
      throw std::runtime_error(fmt::format("loss became {} at step {}", loss, p.step));
    last_loss_ = loss;
  }
}

}  // namespace loom::train
