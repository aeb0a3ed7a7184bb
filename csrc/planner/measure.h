// Confirming the planner with real runs (`loom plan --measure K`): each chosen layout trains
// for a few steps through the local launcher on this machine (the recipe's data, model and
// ranks, no validation, no checkpoints), and its measured step time and peak memory are set
// beside the prediction. A failed run is classified (out of memory, communication error,
// timeout, NaN, other error) and the search goes on; every run has a deadline, so none stalls.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/recipe.h"
#include "launch/local_launcher.h"
#include "planner/layout.h"

namespace loom::planner {

enum class RunStatus { ok, out_of_memory, comm_error, timeout, nan, error };
/// "ok", "out of memory", "communication error", "timeout", "NaN", "error".
const char* to_string(RunStatus s);

/// Device memory of one training step per pipeline stage (bytes, the stage's largest rank): the
/// mem_peak_bytes_by_stage and mem_after_step_bytes_by_stage of a metrics.jsonl record
/// (train/step_memory.h); empty where the run reports none (CPU ranks).
struct StepMemoryRecord {
  int64_t step = 0;
  std::vector<double> peak, after_step;
};

struct MeasureOptions {
  std::string loom_exe;                ///< the `loom` executable to start
  std::string recipe_path;             ///< base recipe (data, tokenizer, model)
  std::vector<std::string> overrides;  ///< the user's overrides of the base recipe
  int steps = 6;                       ///< optimizer steps per run
  int skip_steps = 2;                  ///< first steps left out of the mean (warm-up)
  double timeout_s = 300;              ///< per run; the ranks are then stopped
  std::string work_dir;                ///< run directories <work_dir>/layout-<i>
  /// Overrides after the layout's (a run's own settings, e.g. the memory sweep's precision).
  std::vector<std::string> run_overrides;
  /// Run directory name under work_dir; empty: layout-<index>.
  std::string run_name;
  /// Ranks to start; 0: the recipe's trainer.devices.
  int nproc = 0;
};

struct Measurement {
  RunStatus status = RunStatus::error;
  double step_seconds = 0;  ///< mean of the timed steps (ok runs)
  int steps_timed = 0;
  /// Peak memory of the largest rank (MiB): device memory where the run reports it
  /// (peak_device_memory_mib of metrics.jsonl, GPUs), else the peak resident set.
  double peak_mib = 0;
  double wall_seconds = 0;  ///< whole run, start-up included
  std::string detail;       ///< first error line of the failing rank (failed runs)
  /// The last training step's device memory per stage (ok runs on a device).
  StepMemoryRecord step_memory;
  /// Step times of every successful run of this layout (repeats), in run order.
  std::vector<double> run_seconds;
  /// (slowest − fastest) / fastest over run_seconds: the run-to-run noise (0 with one run).
  double spread() const;
};

/// Combines two runs of one layout: the successful one if only one succeeded, else the faster
/// (its step time; the larger peak memory of both); run_seconds accumulate. A layout counts as
/// failed only when every run failed.
Measurement keep_fastest(const Measurement& a, const Measurement& b);

/// Trains `layout` (world = recipe's trainer.devices ranks on this node) and measures it.
/// `index` names the run directory. Never throws for a failed run: it is classified.
/// Throws std::invalid_argument if the recipe spans more than one node.
Measurement measure_layout(const MeasureOptions& options, const config::Recipe& base,
                           const Layout& layout, int index);

/// The class of a failed run: timeout when the deadline stopped it; out of memory when the
/// earliest failing rank was killed by SIGKILL (the kernel's OOM killer; the launcher itself
/// sends SIGTERM first) or any rank reports an allocation failure; otherwise from the first
/// failing rank's error (`first_error`): NaN, timeout (collective or watchdog), communication
/// error (Gloo/NCCL, closed connections) or error.
RunStatus classify_failure(const std::string& first_error, const std::string& all_output, bool deadline_hit,
                           bool killed_first);

/// How a launch of measured ranks ended: ok when every rank exited 0 before the deadline, else
/// classify_failure of the first failing rank (`detail`: its last error line, or "stopped after
/// N s"); the ranks' largest peak resident memory and longest run time either way.
struct LaunchOutcome {
  RunStatus status = RunStatus::error;
  std::string detail;
  double peak_rss_mib = 0;
  double wall_seconds = 0;
};
LaunchOutcome judge_launch(const launch::LaunchResult& result, double timeout_s);

/// Mean step_time_s of the "train" records of a metrics.jsonl text after the first `skip`
/// steps (all of them when fewer remain); `count` receives the number averaged (0: none).
double mean_step_seconds(const std::string& metrics_jsonl, int skip, int* count);

/// The largest peak_device_memory_mib of a metrics.jsonl text (GPU runs report it), or -1 when
/// no record has one (CPU ranks).
double peak_device_mib(const std::string& metrics_jsonl);

/// The per-stage memory of the last "train" record of a metrics.jsonl text that has it.
StepMemoryRecord last_step_memory(const std::string& metrics_jsonl);

}  // namespace loom::planner
