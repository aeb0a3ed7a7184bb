// The step loop every kind of run shares (`loom train`, `loom ptune`): train from the resumed
// step to trainer.max_steps, validating every val_check_interval steps (and at step 0 of a
// fresh run), saving every checkpoint_callback_params.every_n_steps, and stopping with a save
// when any rank received a stop signal (stop_signal.h) or after `stop_after_steps`.
#pragma once
#include <cstdint>
#include <functional>

#include "config/recipe.h"
#include "runtime/process_groups.h"
#include "train/metrics_log.h"
#include "train/optim/optimizer.h"

namespace loom::train {

struct StepLoopHooks {
  std::function<void(int64_t step)> train_step;  ///< trains step `step` (0-based)
  std::function<void(int64_t done)> validate;    ///< after `done` steps
  std::function<void(int64_t done)> save;        ///< after `done` steps
};

enum class StepLoopEnd {
  kNothingToDo,  ///< the run was already at max_steps
  kStopped,      ///< stopped early (saved)
  kMaxSteps,     ///< trained to max_steps; the caller validates and saves the last step
};

/// After a run's first step in this process: with model.optim.overlap_grad_sync, logs how many
/// gradient buckets started their reduction inside backward (0 means the overlap was not armed).
void report_gradient_overlap(const optim::Optimizer& optimizer, MetricsLog& log, int64_t step);

/// Collective (the stop agreement): every rank calls it with the same arguments.
StepLoopEnd run_step_loop(const config::Recipe& recipe, int64_t first_step, int64_t stop_after_steps,
                          runtime::ProcessGroups& groups, MetricsLog& log, const StepLoopHooks& hooks);

}  // namespace loom::train
