#include "train/training_loop.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <memory>

#include "config/derived.h"
#include "launch/env_rendezvous.h"
#include "launch/local_launcher.h"
#include "planner/hardware.h"
#include "runtime/error_text.h"
#include "train/device_info.h"
#include "train/gpt_step.h"
#include "train/metrics_log.h"
#include "train/model_setup.h"
#include "train/optim/lr_schedule.h"
#include "train/optim/optimizer.h"
#include "train/step_log.h"
#include "train/step_loop.h"
#include "train/stop_signal.h"
#include "train/training_state.h"

namespace fs = std::filesystem;

namespace loom::train {

runtime::RankSessionRequest rank_session_request(const config::Recipe& recipe) {
  runtime::RankSessionRequest request;
  request.layout = config::recipe_layout(recipe);
  request.world_size_source = "the recipe's trainer.num_nodes × trainer.devices";
  request.timeout = std::chrono::milliseconds(int64_t(recipe.model.collective_timeout_s * 1000));
  request.device = recipe.trainer.accelerator == config::Accelerator::kGpu ? runtime::DeviceKind::kAccelerator
                                                                           : runtime::DeviceKind::kCpu;
  return request;
}

namespace {

using Clock = std::chrono::steady_clock;

// Everything one rank holds for the run besides the task's own state. run() reads top-down:
// start the rank, the data, the model; resume; then train, validating and saving on schedule.
class TrainingLoop {
 public:
  TrainingLoop(TrainingTask& task, const TrainOptions& options)
      : task_(task), r_(task.recipe()), options_(options) {}

  int run();
  /// After run() threw: writes this rank's step records not yet flushed (no collective).
  void keep_unflushed_steps() noexcept {
    if (step_log_) step_log_->keep_unflushed_steps();
  }

 private:
  void start();
  void build_model();
  StepLogConfig step_log_config() const;
  void resume();
  void train_step(int64_t step);
  std::optional<double> validate(int64_t step);
  void save(int64_t iteration);
  int finish();
  TrainingParts parts() {
    return {&model_.chunks, optimizer_.get(), scheduler_.get(), scaler_.get(),
            model_.checkpoint_trainable_only ? &model_.trainable : nullptr};
  }

  TrainingTask& task_;
  const config::Recipe& r_;
  TrainOptions options_;
  TaskContext ctx_;
  std::shared_ptr<runtime::ProcessGroups> groups_;
  std::unique_ptr<RunDirectory> dir_;
  std::unique_ptr<MetricsLog> log_;
  TaskModel model_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<optim::LrScheduler> scheduler_;
  std::unique_ptr<optim::LossScaler> scaler_;
  std::unique_ptr<GptStep> step_;
  std::unique_ptr<StepLog> step_log_;
  TrainingPosition position_;
  int64_t first_step_ = 0;  ///< the first step this process trains (after resume)
};

int TrainingLoop::run() {
  start();
  task_.prepare_data(ctx_);
  build_model();
  resume();
  first_step_ = position_.iteration;
  dir_->write_resolved_recipe(task_.run_directory_recipe());
  install_stop_signal_handlers();

  const StepLoopHooks hooks{[&](int64_t step) { train_step(step); }, [&](int64_t done) { validate(done); },
                            [&](int64_t done) { save(done); }};
  if (run_step_loop(r_, position_.iteration, options_.stop_after_steps, *groups_, *log_, hooks) !=
      StepLoopEnd::kMaxSteps)
    return finish();
  const int64_t max_steps = r_.trainer.max_steps;
  const auto val_loss = validate(max_steps);
  // NeMo's save_last: the last step is saved even off the every_n_steps grid; without it, only
  // the grid's steps are (Lightning's ModelCheckpoint).
  const auto& saving = r_.exp_manager.checkpoint_callback_params;
  if (saving.save_last || (saving.every_n_steps > 0 && max_steps % saving.every_n_steps == 0)) save(max_steps);
  task_.at_end(ctx_, model_, max_steps, val_loss);
  return finish();
}

void TrainingLoop::start() {
  const auto info = launch::rendezvous_from_env();
  ctx_.layout = config::recipe_layout(r_);
  // Before anything in the run directory is touched: one run per directory.
  dir_ = std::make_unique<RunDirectory>(run_directory_options(r_, task_.command(), options_.resume_iteration),
                                        info.rank == 0);
  const runtime::RankSession session = runtime::start_rank_session(info, rank_session_request(r_));
  groups_ = session.groups;
  groups_->host_world().barrier();
  const bool rank0 = groups_->rank() == 0;
  log_ = std::make_unique<MetricsLog>(rank0 ? (fs::path(dir_->run_dir()) / "metrics.jsonl").string() : "", rank0);
  dir_->attach(*groups_, *log_);
  ctx_.groups = groups_.get();
  ctx_.dir = dir_.get();
  ctx_.log = log_.get();
  const Layout& s = ctx_.layout;
  log_->message(fmt::format("[loom] {}{} | t={} p={} v={} d={} | {} micro-batches of {} per step", task_.run_label(),
                            groups_->layout().describe(), s.tp, s.pp, s.vp, s.dp, s.micro_batches(), s.micro_batch));
  log_->message("[loom] device: " + session.device.describe());
}

void TrainingLoop::build_model() {
  model_ = task_.build_model(ctx_);
  optimizer_ = optim::Optimizer::create(model_.trainable, groups_, optimizer_options(r_));
  scheduler_ = std::make_unique<optim::LrScheduler>(lr_schedule_config(r_));
  if (r_.trainer.precision == config::Precision::kFp16)
    scaler_ = std::make_unique<optim::LossScaler>(optim::LossScalerConfig{}, groups_->device());
  step_ = std::make_unique<GptStep>(model_.chunks, *groups_, ctx_.layout);
  ctx_.step = step_.get();
  step_log_ = std::make_unique<StepLog>(step_log_config(), *groups_, ctx_.is_rank0() ? log_.get() : nullptr);
  task_.attach_optimizer(ctx_, model_, *optimizer_);
}

StepLogConfig TrainingLoop::step_log_config() const {
  const Layout& s = ctx_.layout;
  StepLogConfig lc;
  lc.max_steps = r_.trainer.max_steps;
  lc.print_every = r_.trainer.log_every_n_steps;
  lc.tokens_per_step = s.global_batch * r_.model.data.seq_length;
  lc.model_flops_per_step = model_flops_per_step(model_.config, s) * model_.flops_fraction;
  lc.world_size = groups_->layout().world_size();
  // MFU needs the accelerator's peak; CPUs have no entry in the table, so no MFU there.
  lc.peak_tflops = planner::peak_tflops_for_device(accelerator_name(groups_->device()));
  if (r_.trainer.max_time)
    if (const auto seconds = config::parse_max_time(*r_.trainer.max_time)) lc.max_time_s = double(*seconds);
  return lc;
}

void TrainingLoop::resume() {
  const auto point = dir_->resume(task_.checkpoint_layout(ctx_, model_));
  if (!point) return;
  position_ = restore_training_state(point->state, parts());
  task_.after_resume(ctx_);
  log_->message(fmt::format("[loom] resumed from {} (step {}, {} samples consumed)",
                            dir_->iteration_path(point->iteration), position_.iteration,
                            position_.consumed_samples));
}

void TrainingLoop::train_step(int64_t step) {
  const auto start = Clock::now();
  step_log_->begin_step();
  const Layout& s = ctx_.layout;
  // Before the micro-batches: arms model.optim.overlap_grad_sync and waits for the parameters'
  // all-gathers (overlap_param_sync), which a task may read while it builds its batches (prompt
  // learning runs its prompt encoder there).
  optimizer_->start_iteration(s.micro_batches());
  const std::vector<MicroBatch> batches = task_.step_micro_batches(ctx_, step, position_.consumed_samples);

  model::DropoutContext dropout;
  dropout.seed = static_cast<uint64_t>(r_.model.seed);
  dropout.step = static_cast<uint64_t>(step);
  dropout.global_batch = s.global_batch;
  dropout.training = true;
  at::Tensor loss = step_->train(batches, dropout, scaler_ ? scaler_->scale_tensor() : at::Tensor(),
                                 [&] { optimizer_->accumulate_grads(); });
  const optim::StepResult result = optimizer_->step(scheduler_->lr(), scaler_.get());
  if (step == first_step_) report_gradient_overlap(*optimizer_, *log_, step);
  scheduler_->advance();
  position_.iteration = step + 1;
  position_.consumed_samples += s.global_batch;
  step_log_->add(step + 1, loss, result, scheduler_->lr(), seconds_since(start), position_.consumed_samples);
}

std::optional<double> TrainingLoop::validate(int64_t step) {
  if (!task_.has_validation() || r_.trainer.limit_val_batches == 0) return std::nullopt;
  optimizer_->wait_for_params();  // model.optim.overlap_param_sync leaves the last gather open
  step_log_->flush();
  return task_.validate(ctx_, model_, step);
}

void TrainingLoop::save(int64_t iteration) {
  step_log_->flush();  // a non-finite loss stops the run before it is saved
  optimizer_->wait_for_params();
  dir_->save(iteration, task_.checkpoint_layout(ctx_, model_), [&] {
    return capture_training_state(parts(), position_, groups_->coords().tp, ctx_.layout.tp);
  });
}

int TrainingLoop::finish() {
  step_log_->flush();
  log_->print_summary();
  task_.before_finish(ctx_, model_);
  groups_->host_world().barrier();
  groups_->shutdown();
  return 0;
}

}  // namespace

int run_training_task(const std::function<std::unique_ptr<TrainingTask>()>& make_task, const TrainOptions& options) {
  std::unique_ptr<TrainingTask> task;
  std::unique_ptr<TrainingLoop> loop;
  try {
    task = make_task();
    loop = std::make_unique<TrainingLoop>(*task, options);
    return loop->run();
  } catch (const std::exception& e) {
    // Recorded while this rank's groups are still open: once `loop` unwinds, its sockets close
    // and the peers fail too, and the launcher must see that this error came first. Then this
    // rank's step records not yet flushed (no collective: peers may be gone), so that a run
    // that fails keeps the losses of the steps it did.
    launch::record_rank_error(runtime::error_text(e));
    if (loop) loop->keep_unflushed_steps();
    throw;
  }
}

}  // namespace loom::train
