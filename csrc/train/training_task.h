// What differs between the ways Loom trains, behind the one training loop (training_loop.h;
// docs/architecture.md, "One training loop"). A task says which model chunks it builds and
// which of their parameters train, what a step's micro-batches are, how validation scores, what
// a checkpoint records beyond the layout, and what happens at the end. Everything else (run
// directory, metrics and step log, optimizer, LR schedule, loss scaler, the pipeline step,
// checkpoints, resume, stop signals, failure handling, MFU, gradient-sync overlap) is the
// loop's. Pretraining (train/pretraining_task.h), prompt learning (ptune/prompt_task.h) and
// fine-tuning (finetune/finetune_task.h) are the tasks today.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/recipe.h"
#include "model/gpt_config.h"
#include "model/gpt_stage.h"
#include "runtime/process_groups.h"
#include "train/checkpoint.h"
#include "train/metrics_log.h"
#include "train/micro_batches.h"
#include "train/run_directory.h"
#include "train/run_settings.h"
#include "train/training_state.h"

namespace loom::train {

class GptStep;
namespace optim {
class Optimizer;
}

/// The parts of the run a task may use; each pointer is set once the loop has built the part
/// (groups, dir and log before prepare_data; step after build_model).
struct TaskContext {
  Layout layout;  ///< the run's parallel layout (config::recipe_layout)
  runtime::ProcessGroups* groups = nullptr;
  RunDirectory* dir = nullptr;
  MetricsLog* log = nullptr;
  GptStep* step = nullptr;
  bool is_rank0() const { return groups->rank() == 0; }
};

/// The model a task trains.
struct TaskModel {
  model::GptConfig config;
  std::vector<model::GptStage> chunks;  ///< this rank's chunks, one per virtual stage it holds
  /// What the optimizer updates: every chunk parameter (pretraining) or parameters outside the
  /// chunks (prompt learning's prompt encoder; the chunks are then frozen).
  model::ParamList trainable;
  /// Whether a checkpoint holds `trainable` only (TrainingParts::params) rather than the chunks.
  bool checkpoint_trainable_only = false;
  /// A step's model FLOPs as a fraction of a training iteration's (train::model_flops_per_step): 1, or 2/3
  /// when the chunks are frozen (forward and the input-gradient half of backward).
  double flops_fraction = 1.0;
};

class TrainingTask {
 public:
  virtual ~TrainingTask() = default;

  /// "loom train", "loom ptune": the run directory's lock names it.
  virtual std::string command() const = 0;
  /// The recipe the run follows (a task may adopt fields, e.g. prompt learning's base shape).
  virtual const config::Recipe& recipe() const = 0;
  /// What the run directory's config.yaml records, the recipe that generate, serve, eval and
  /// convert read the run's model and tokenizer from: recipe(), unless the task's checkpoints
  /// are another kind's (full fine-tuning: whole-model checkpoints, a pretraining recipe).
  virtual config::Recipe run_directory_recipe() const { return recipe(); }
  /// Words before the layout in the run's first log line ("" or "prompt learning (p-tuning) on ").
  virtual std::string run_label() const { return ""; }

  /// After the groups exist: reads or indexes the data and logs what it found. May be collective.
  virtual void prepare_data(TaskContext& ctx) = 0;
  /// This rank's model. May be collective.
  virtual TaskModel build_model(TaskContext& ctx) = 0;
  /// Once the optimizer over TaskModel::trainable exists (e.g. to wait for its parameter
  /// gathers inside forward); then logs the model's line.
  virtual void attach_optimizer(TaskContext& ctx, TaskModel& model, optim::Optimizer& optimizer) = 0;
  /// What a checkpoint of this run records as its layout and shape (a resume must match).
  virtual CheckpointLayout checkpoint_layout(const TaskContext& ctx, const TaskModel& model) const {
    return train::checkpoint_layout(ctx.layout, model.config);
  }
  /// After a checkpoint was restored (e.g. reading what the task keeps beside it).
  virtual void after_resume(TaskContext& ctx) {}

  /// This rank's layout.micro_batches() of 0-based step `step`, which starts after
  /// `consumed_samples` samples of the run.
  virtual std::vector<MicroBatch> step_micro_batches(TaskContext& ctx, int64_t step, int64_t consumed_samples) = 0;
  /// Whether the run has validation data to score (else validate() is never called; the loop
  /// also skips it when trainer.limit_val_batches is 0).
  virtual bool has_validation() const = 0;
  /// Scores the validation data after `step` steps and writes the record; the loss, or nullopt
  /// when nothing was scored. Collective.
  virtual std::optional<double> validate(TaskContext& ctx, TaskModel& model, int64_t step) = 0;
  /// After the last step's validation (its loss, if any) and checkpoint. Collective.
  virtual void at_end(TaskContext& ctx, TaskModel& model, int64_t max_steps, std::optional<double> val_loss) {}
  /// Last checks before the groups close (after the summary). Collective.
  virtual void before_finish(TaskContext& ctx, const TaskModel& model) {}
};

}  // namespace loom::train
