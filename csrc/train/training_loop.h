// The one training loop of every way Loom trains (docs/architecture.md, "One training loop"):
// one rank of a run, whatever its task (training_task.h). It starts the rank
// (runtime/rank_session.h), takes the run directory, builds the optimizer, LR schedule and
// loss scaler around the task's model, resumes, trains from the resumed step to
// trainer.max_steps with validation and checkpoints on schedule (step_loop.h), stops with a
// save on SIGTERM/SIGUSR1/SIGINT, logs every step with MFU, and on failure records the rank's
// error and keeps its unflushed step records.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "config/recipe.h"
#include "runtime/rank_session.h"
#include "train/training_task.h"

namespace loom::train {

struct TrainOptions {
  /// Run only this many steps in this process, then save and exit as if preempted (tests of
  /// resume; 0 = no limit).
  int64_t stop_after_steps = 0;
  /// Resume from this iteration instead of the tracker's (`--iteration N`), e.g. when the
  /// newest checkpoint is damaged. It must be complete.
  std::optional<int64_t> resume_iteration;
};

/// The rank session a recipe asks for: trainer.num_nodes × trainer.devices ranks, t, p,
/// model.collective_timeout_s, and trainer.accelerator's device.
runtime::RankSessionRequest rank_session_request(const config::Recipe& recipe);

/// Makes the task (its planning errors are this rank's errors too), then runs it on this rank (rendezvous from the environment; every rank runs it with the same
/// recipe). Takes the run directory's lock on world rank 0 (launch/run_lock.h) before the
/// groups exist; finishes or rolls back a checkpoint commit a killed run left; resumes when
/// exp_manager.resume_if_exists from the tracker's iteration, else the newest complete one
/// (train::CheckpointError naming the older complete ones when it cannot load); writes
/// config.yaml once resumed. Returns 0 when done or stopped by a signal after saving; throws on
/// failure after recording this rank's error for the launcher.
int run_training_task(const std::function<std::unique_ptr<TrainingTask>()>& make_task, const TrainOptions& options);

}  // namespace loom::train
