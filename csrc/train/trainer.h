// `loom train` on one rank: the training loop of a validated recipe (docs/design/conventions.md; issue
// "loom train"). Every rank of the world runs it with the same recipe; ranks find each other
// through the environment (launch/env_rendezvous.h).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "config/recipe.h"

namespace loom::train {

struct TrainOptions {
  /// Run only this many steps in this process, then save and exit as if preempted (tests of
  /// resume; 0 = no limit).
  int64_t stop_after_steps = 0;
  /// Resume from this iteration instead of the tracker's (`loom train --iteration N`), e.g.
  /// when the newest checkpoint is damaged. It must be complete.
  std::optional<int64_t> resume_iteration;
};

/// Trains per the recipe: takes the run directory's lock (rank 0; launch/run_lock.h), builds
/// the process groups, the data, the model chunks and the optimizer; finishes or rolls back a
/// checkpoint commit a killed run left; resumes when exp_manager.resume_if_exists from the
/// tracker's iteration, else the newest complete one (train::CheckpointError with the older
/// complete iterations named when it cannot load); writes config.yaml once resumed;
/// validates every val_check_interval steps; logs metrics; saves checkpoints every
/// checkpoint_callback_params.every_n_steps steps, at the end, and on SIGTERM/SIGUSR1/SIGINT.
/// Returns 0 when done (or stopped by a signal after saving). Throws on failure.
int run_training(const config::Recipe& recipe, const TrainOptions& options = {});

}  // namespace loom::train
