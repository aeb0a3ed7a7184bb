// What every kind of run (`loom train`, `loom ptune`) does with its run directory
// (docs/design/hardening.md): one run per directory (an exclusive lock held by world rank 0
// from before the groups exist), a half-done checkpoint commit finished or rolled back before
// anyone reads, the iteration to resume from (--iteration, else the tracker's, else the
// newest complete folder; never silently step 0 when checkpoints exist; a damaged newest
// checkpoint refused naming an older complete one), a load every rank agrees on, saves, and
// config.yaml written only once the run has resumed.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "config/recipe.h"
#include "launch/run_lock.h"
#include "runtime/process_groups.h"
#include "train/checkpoint.h"
#include "train/metrics_log.h"

namespace loom::train {

struct RunDirectoryOptions {
  std::string run_dir;
  std::string command;                     ///< e.g. "loom train": for the lock and advice
  std::string recipe_file;                 ///< for advice ("loom train FILE ... --iteration N")
  std::optional<int64_t> resume_iteration; ///< --iteration
  bool resume_if_exists = true;            ///< exp_manager.resume_if_exists
  bool save_checkpoints = true;            ///< exp_manager.create_checkpoint_callback
};

/// A checkpoint to resume from: its iteration and this rank's state.
struct ResumePoint {
  int64_t iteration = 0;
  RankCheckpoint state;
};

/// The run directory options of `recipe` (config::run_directory, exp_manager's resume and
/// checkpoint switches) for `command` ("loom train", "loom ptune").
RunDirectoryOptions run_directory_options(const config::Recipe& recipe, const std::string& command,
                                          std::optional<int64_t> resume_iteration);

/// <run_dir>/checkpoints.
std::string checkpoints_dir(const RunDirectoryOptions& options);

/// The iteration a run resumes from, the rule written once: nullopt without
/// options.resume_if_exists or when there is no checkpoint (start afresh); else --iteration
/// (options.resume_iteration), else the tracker's, else the newest complete iteration folder
/// (then `note`, when given, says so for the log). Reads only; RunDirectory::resume calls it
/// after the commit recovery, `loom ptune` before its run to find the base iteration that
/// checkpoint recorded (ptune::pinned_base_iteration). Throws CheckpointError, with advice (the
/// newest complete older checkpoint and the command resuming from it), when the chosen
/// checkpoint is incomplete, the tracker is malformed, or no iteration folder is complete.
std::optional<int64_t> resume_iteration(const RunDirectoryOptions& options, std::string* note = nullptr);

class RunDirectory {
 public:
  /// On world rank 0 (`rank0`) takes the lock (throws launch::RunLockError naming the holder).
  RunDirectory(RunDirectoryOptions options, bool rank0);
  ~RunDirectory();

  /// Once the groups exist: where messages go; notes a stale lock left by a killed run.
  void attach(runtime::ProcessGroups& groups, MetricsLog& log);

  const std::string& run_dir() const { return options_.run_dir; }
  const std::string& checkpoint_dir() const { return checkpoint_dir_; }

  /// Recovers the checkpoint folder (rank 0), then, with resume_if_exists, loads this rank's
  /// state of the chosen iteration; nullopt: no checkpoint, start afresh. Collective over the
  /// world. Throws CheckpointError (with advice) on every rank when any rank cannot load.
  std::optional<ResumePoint> resume(const CheckpointLayout& layout);
  /// "<checkpoints>/iter_N", for messages.
  std::string iteration_path(int64_t iteration) const;

  /// Saves `capture()` as `iteration` unless checkpoints are off or it was just saved (a stop
  /// landing on a periodic save). Collective over the world.
  void save(int64_t iteration, const CheckpointLayout& layout, const std::function<RankCheckpoint()>& capture);

  /// Writes <run_dir>/config.yaml (world rank 0): call once the run has resumed.
  void write_resolved_recipe(const config::Recipe& recipe);

 private:
  RunDirectoryOptions options_;
  std::string checkpoint_dir_;
  std::unique_ptr<launch::RunDirectoryLock> lock_;
  runtime::ProcessGroups* groups_ = nullptr;
  MetricsLog* log_ = nullptr;
  int64_t last_saved_ = -1;
};

}  // namespace loom::train
