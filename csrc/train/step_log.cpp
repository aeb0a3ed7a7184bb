#include "train/step_log.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <sys/resource.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "runtime/run_device.h"

namespace loom::train {
namespace {

double max_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;
}

// The largest rank's peak device memory in MiB, or -1 on CPU ranks (collective).
double largest_peak_device_mib(runtime::ProcessGroups& groups) {
  const auto bytes = runtime::peak_device_memory_bytes(groups.device());
  // host: a host value, reduced on the host group.
  at::Tensor peak = at::full({1}, bytes ? double(*bytes) / (1024.0 * 1024.0) : -1.0,
                             at::TensorOptions().dtype(at::kDouble));
  groups.host_world().all_reduce(peak, runtime::ReduceOp::kMax);
  return peak.item<double>();
}

}  // namespace

StepLog::StepLog(StepLogConfig config, runtime::ProcessGroups& groups, MetricsLog* log)
    : config_(config),
      groups_(groups),
      log_(log),
      last_loss_(NAN),
      start_(std::chrono::steady_clock::now()) {}

void StepLog::add(int64_t step, at::Tensor loss, const optim::StepResult& result, double lr,
                  double seconds, int64_t consumed_samples) {
  pending_.push_back({step, std::move(loss), result, lr, seconds, consumed_samples});
  if (step % std::max<int64_t>(1, config_.print_every) == 0 || step == 1) {
    flush();
  } else if (log_) {
    ++steps_timed_;
    const double per_step =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count() /
        double(steps_timed_);
    const double eta = per_step * double(config_.max_steps - step);
    log_->progress(fmt::format("step {}/{} | loss {:.4f} (step {}) | ETA {:.0f}:{:02.0f}", step,
                               config_.max_steps, last_loss_, step - int64_t(pending_.size()),
                               std::floor(eta / 60), std::fmod(eta, 60.0)));
  }
}

void StepLog::flush() {
  if (pending_.empty()) return;
  std::vector<at::Tensor> losses;
  for (const auto& p : pending_) losses.push_back(p.loss.reshape({1}));
  const at::Tensor host = at::cat(losses).to(at::kCPU);  // the one sync
  const double peak_device_mib = largest_peak_device_mib(groups_);
  const double rss = max_rss_mib();
  std::vector<Pending> done;
  done.swap(pending_);
  for (size_t i = 0; i < done.size(); ++i) {
    const auto& p = done[i];
    const double loss = host[static_cast<int64_t>(i)].item<double>();
    if (log_) {
      const double tflops = config_.model_flops_per_step / p.seconds / config_.world_size / 1e12;
      nlohmann::json rec = {{"kind", "train"},
                            {"step", p.step},
                            {"max_steps", config_.max_steps},
                            {"loss", loss},
                            {"lr", p.lr},
                            {"grad_norm", p.result.grad_norm},
                            {"loss_scale", p.result.loss_scale},
                            {"skipped", p.result.skipped},
                            {"step_time_s", p.seconds},
                            {"tokens_per_s", double(config_.tokens_per_step) / p.seconds},
                            {"model_tflops_per_device", tflops},
                            {"consumed_samples", p.consumed_samples},
                            {"max_rss_mib", rss}};
      if (peak_device_mib >= 0) rec["peak_device_memory_mib"] = peak_device_mib;
      if (config_.peak_tflops) rec["mfu"] = tflops / *config_.peak_tflops;
      log_->write(rec, i + 1 == done.size());
    }
    if (!std::isfinite(loss))
      throw std::runtime_error(fmt::format("loss became {} at step {}", loss, p.step));
    last_loss_ = loss;
  }
}

}  // namespace loom::train
