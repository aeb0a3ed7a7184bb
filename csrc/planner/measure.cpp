#include "planner/measure.h"

#include "planner/text_io.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "launch/file_util.h"
#include "launch/local_launcher.h"
#include "planner/recipe_input.h"

namespace loom::planner {
namespace {

bool contains_any(const std::string& text, std::initializer_list<const char*> needles) {
  for (const char* n : needles)
    if (text.find(n) != std::string::npos) return true;
  return false;
}

// The last non-empty line: ranks print their error message last.
std::string last_line(const std::string& s) {
  std::istringstream in(s);
  std::string line, last;
  while (std::getline(in, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  return last;
}

}  // namespace

const char* to_string(RunStatus s) {
  switch (s) {
    case RunStatus::ok: return "ok";
    case RunStatus::out_of_memory: return "out of memory";
    case RunStatus::comm_error: return "communication error";
    case RunStatus::timeout: return "timeout";
    case RunStatus::nan: return "NaN";
    case RunStatus::error: return "error";
  }
  return "error";
}

RunStatus classify_failure(const std::string& first_error, const std::string& all_output, bool deadline_hit,
                           bool killed_first) {
  if (deadline_hit) return RunStatus::timeout;
  // Memory first and from every rank: the rank that runs out of memory often dies silently
  // (the OOM killer's SIGKILL) or after its peers have already reported closed connections.
  const std::string everything = lower(first_error + "\n" + all_output);
  if (killed_first ||
      contains_any(everything, {"out of memory", "std::bad_alloc", "cannot allocate memory", "outofmemoryerror"}))
    return RunStatus::out_of_memory;
  // The rest from the rank that failed first: its peers only report the consequences.
  const std::string text = lower(first_error);
  if (contains_any(text, {"loss became nan", "loss became inf", "loss became -inf", "non-finite"}))
    return RunStatus::nan;
  if (contains_any(text, {"timed out", "timeout", "watchdog"})) return RunStatus::timeout;
  if (contains_any(text, {"gloo", "nccl", "connection closed", "connection reset", "connection refused",
                          "broken pipe", "rendezvous"}))
    return RunStatus::comm_error;
  return RunStatus::error;
}

double Measurement::spread() const {
  if (run_seconds.size() < 2) return 0;
  const auto [lo, hi] = std::minmax_element(run_seconds.begin(), run_seconds.end());
  return (*hi - *lo) / *lo;
}

Measurement keep_fastest(const Measurement& a, const Measurement& b) {
  const bool a_ok = a.status == RunStatus::ok, b_ok = b.status == RunStatus::ok;
  Measurement out = !a_ok ? b : (!b_ok ? a : (b.step_seconds < a.step_seconds ? b : a));
  if (!a_ok && !b_ok) out = a;  // every run failed: report the first failure
  out.peak_mib = std::max(a.peak_mib, b.peak_mib);
  out.run_seconds = a.run_seconds;
  out.run_seconds.insert(out.run_seconds.end(), b.run_seconds.begin(), b.run_seconds.end());
  return out;
}

// The largest peak_device_memory_mib of the training records, or -1 when none has one.
double peak_device_mib(const std::string& metrics) {
  double peak = -1;
  std::istringstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    const auto rec = nlohmann::json::parse(line, nullptr, false);
    if (rec.is_discarded() || !rec.is_object()) continue;
    if (rec.contains("peak_device_memory_mib") && rec["peak_device_memory_mib"].is_number())
      peak = std::max(peak, rec["peak_device_memory_mib"].get<double>());
  }
  return peak;
}

StepMemoryRecord last_step_memory(const std::string& metrics) {
  StepMemoryRecord out;
  std::istringstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    const auto rec = nlohmann::json::parse(line, nullptr, false);
    if (rec.is_discarded() || !rec.is_object() || rec.value("kind", "") != "train") continue;
    if (!rec.contains("mem_peak_bytes_by_stage") || !rec.contains("mem_after_step_bytes_by_stage")) continue;
    const auto& peak = rec["mem_peak_bytes_by_stage"];
    const auto& after = rec["mem_after_step_bytes_by_stage"];
    if (!peak.is_array() || !after.is_array() || peak.size() != after.size()) continue;
    StepMemoryRecord r;
    r.step = rec.value("step", int64_t(0));
    for (const auto& v : peak) r.peak.push_back(v.is_number() ? v.get<double>() : 0.0);
    for (const auto& v : after) r.after_step.push_back(v.is_number() ? v.get<double>() : 0.0);
    out = std::move(r);
  }
  return out;
}

double mean_step_seconds(const std::string& metrics, int skip, int* count) {
  std::vector<double> times;
  std::istringstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto rec = nlohmann::json::parse(line, nullptr, false);
    if (rec.is_discarded() || rec.value("kind", "") != "train" || !rec.contains("step_time_s")) continue;
    if (rec["step_time_s"].is_number()) times.push_back(rec["step_time_s"].get<double>());
  }
  const std::size_t from = times.size() > std::size_t(std::max(0, skip)) ? std::size_t(std::max(0, skip)) : 0;
  double sum = 0;
  for (std::size_t i = from; i < times.size(); ++i) sum += times[i];
  const int n = int(times.size() - from);
  if (count) *count = n;
  return n > 0 ? sum / n : 0.0;
}

Measurement measure_layout(const MeasureOptions& opt, const config::Recipe& base, const Layout& layout,
                           int index) {
  if (base.trainer.num_nodes != 1)
    throw std::invalid_argument(fmt::format(
        "--measure runs the layouts on this machine: the recipe's trainer.num_nodes must be 1, found {}",
        base.trainer.num_nodes));
  const std::string run_dir =
      opt.run_name.empty() ? fmt::format("{}/layout-{}", opt.work_dir, index) : opt.work_dir + "/" + opt.run_name;
  launch::remove_tree(run_dir);

  launch::LaunchOptions lo;
  lo.argv = {opt.loom_exe, "train", opt.recipe_path};
  for (const auto& o : opt.overrides) lo.argv.push_back(o);
  for (const auto& o : layout_overrides(layout, base)) lo.argv.push_back(o);
  for (const auto& o : opt.run_overrides) lo.argv.push_back(o);
  const double collective_timeout = std::min(base.model.collective_timeout_s, std::max(10.0, opt.timeout_s / 2));
  for (const std::string& o :
       {fmt::format("trainer.max_steps={}", opt.steps), std::string("trainer.limit_val_batches=0"),
        std::string("trainer.log_every_n_steps=1"), "exp_manager.explicit_log_dir=" + run_dir,
        std::string("exp_manager.resume_if_exists=false"),
        std::string("exp_manager.create_checkpoint_callback=false"),
        fmt::format("model.collective_timeout_s={}", collective_timeout)})
    lo.argv.push_back(o);
  lo.nproc = opt.nproc > 0 ? opt.nproc : int(base.trainer.devices);
  lo.timeout_s = opt.timeout_s;
  lo.grace_s = 5;
  lo.capture_output = true;
  lo.echo_output = false;

  Measurement out;
  launch::LaunchResult result;
  try {
    result = launch::launch_local(lo);
  } catch (const std::exception& e) {
    out.status = RunStatus::error;
    out.detail = e.what();
    return out;
  }
  const LaunchOutcome outcome = judge_launch(result, opt.timeout_s);
  out.peak_mib = outcome.peak_rss_mib;
  out.wall_seconds = outcome.wall_seconds;
  if (outcome.status != RunStatus::ok) {
    out.status = outcome.status;
    out.detail = outcome.detail;
    return out;
  }
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::stringstream ss;
  ss << in.rdbuf();
  out.step_seconds = mean_step_seconds(ss.str(), opt.skip_steps, &out.steps_timed);
  if (const double device_mib = peak_device_mib(ss.str()); device_mib >= 0) out.peak_mib = device_mib;
  out.step_memory = last_step_memory(ss.str());
  if (out.steps_timed > 0) {
    out.status = RunStatus::ok;
    out.run_seconds = {out.step_seconds};
  } else {
    out.status = RunStatus::error;
    out.detail = fmt::format("the run succeeded but {}/metrics.jsonl has no training step", run_dir);
  }
  return out;
}

LaunchOutcome judge_launch(const launch::LaunchResult& result, double timeout_s) {
  LaunchOutcome out;
  std::string all_output;
  const launch::RankExit* first_failure = nullptr;  // the earliest rank to exit with an error
  for (const auto& r : result.ranks) {
    out.peak_rss_mib = std::max(out.peak_rss_mib, r.max_rss_mib);
    out.wall_seconds = std::max(out.wall_seconds, r.seconds);
    all_output += r.output;
    if (r.exit_code != 0 && (!first_failure || r.seconds < first_failure->seconds)) first_failure = &r;
  }
  if (!result.timed_out && result.exit_code() == 0) {
    out.status = RunStatus::ok;
    return out;
  }
  // The launcher stops the other ranks with SIGTERM first, so a SIGKILL on the earliest
  // failure came from outside: the kernel's OOM killer.
  const bool killed_first = first_failure && first_failure->signaled && first_failure->exit_code == 128 + 9;
  out.status = classify_failure(result.first_error, all_output, result.timed_out, killed_first);
  out.detail = result.timed_out ? fmt::format("stopped after {:g} s", timeout_s)
                                : last_line(result.first_error.empty() ? result.summary() : result.first_error);
  return out;
}

}  // namespace loom::planner
