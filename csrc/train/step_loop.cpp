#include "train/step_loop.h"

#include <fmt/format.h>

#include <chrono>

#include "config/derived.h"

#include "train/stop_signal.h"

namespace loom::train {

void report_gradient_overlap(const optim::Optimizer& optimizer, MetricsLog& log, int64_t step) {
  if (!optimizer.options().overlap_grad_reduce) return;
  log.message(fmt::format("[loom] model.optim.overlap_grad_sync: {} gradient bucket(s) started their reduction inside "
                          "the backward of step {}",
                          optimizer.buckets_started_in_backward(), step + 1));
}

StepLoopEnd run_step_loop(const config::Recipe& recipe, int64_t first_step, int64_t stop_after_steps,
                          runtime::ProcessGroups& groups, MetricsLog& log, const StepLoopHooks& hooks) {
  const int64_t max_steps = recipe.trainer.max_steps;
  const int64_t every_save = recipe.exp_manager.checkpoint_callback_params.every_n_steps;
  const int64_t every_val = recipe.trainer.val_check_interval;
  if (first_step >= max_steps) {
    log.message("[loom] the checkpoint is already at trainer.max_steps: nothing to train");
    return StepLoopEnd::kNothingToDo;
  }
  // trainer.max_time bounds this process's training time, as Lightning's Timer does: the run
  // saves and ends at the first step boundary past it (the ranks agree on when).
  const auto max_time = recipe.trainer.max_time ? config::parse_max_time(*recipe.trainer.max_time) : std::nullopt;
  const auto start = std::chrono::steady_clock::now();
  const auto out_of_time = [&] {
    return max_time && std::chrono::steady_clock::now() - start >= std::chrono::seconds(*max_time);
  };
  // TensorBoard: this process's steps replace what an earlier one logged from here on (a fresh
  // run redoes step 0's validation; a resumed one starts after its checkpoint's step).
  log.start_session(first_step == 0 ? 0 : first_step + 1);
  if (first_step == 0 && every_val > 0) hooks.validate(0);
  for (int64_t step = first_step; step < max_steps; ++step) {
    hooks.train_step(step);
    const int64_t done = step + 1;
    if (done == max_steps) break;
    if (every_val > 0 && done % every_val == 0) hooks.validate(done);
    if (every_save > 0 && done % every_save == 0) hooks.save(done);
    StopReason local = out_of_time() ? StopReason::kMaxTime : StopReason::kNone;
    if (local == StopReason::kNone && stop_after_steps > 0 && done - first_step >= stop_after_steps)
      local = StopReason::kRequested;
    if (const StopReason reason = agreed_stop_reason(groups, local); reason != StopReason::kNone) {
      log.message(fmt::format("[loom] {} at step {}: saving and exiting",
                              reason == StopReason::kMaxTime ? "trainer.max_time reached" : "stop requested", done));
      hooks.save(done);
      return StepLoopEnd::kStopped;
    }
  }
  return StepLoopEnd::kMaxSteps;
}

}  // namespace loom::train
