// `loom train` on one rank: the training loop of a validated recipe (conventions.md; issue
// "loom train"). Every rank of the world runs it with the same recipe; ranks find each other
// through the environment (launch/env_rendezvous.h).
#pragma once
#include <string>

#include "config/recipe.h"

namespace loom::train {

struct TrainOptions {
  /// Run only this many steps in this process, then save and exit as if preempted (tests of
  /// resume; 0 = no limit).
  int64_t stop_after_steps = 0;
};

/// Trains per the recipe: builds the process groups, the data, the model chunks and the
/// optimizer; resumes from the run directory's checkpoint when exp_manager.resume_if_exists;
/// validates every val_check_interval steps; logs metrics; saves checkpoints every
/// checkpoint_callback_params.every_n_steps steps, at the end, and on SIGTERM/SIGUSR1.
/// Returns 0 when done (or stopped by a signal after saving). Throws on failure.
int run_training(const config::Recipe& recipe, const TrainOptions& options = {});

}  // namespace loom::train
