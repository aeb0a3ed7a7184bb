#include "finetune/lora_task.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <memory>

#include "finetune/lora_run.h"
#include "generate/checkpoint_reader.h"
#include "generate/model_loader.h"
#include "model/init.h"
#include "model/lora.h"
#include "ptune/frozen_base.h"
#include "train/metrics_log.h"
#include "train/model_setup.h"
#include "train/optim/optimizer.h"
#include "train/pretraining_task.h"

namespace fs = std::filesystem;

namespace loom::finetune {
namespace {

bool is_adapter(const model::Param& p) { return p.name.find(".lora_") != std::string::npos; }

// "<linear>.lora_a.weight" -> "<linear>".
std::string adapted_linear(const std::string& adapter_name) { return adapter_name.substr(0, adapter_name.rfind(".lora_")); }

// The base checkpoint's tensors plus every adapter's full initial value (A Kaiming-uniform
// drawn under its name, B zero; model/lora.h), so that filling a stage from it gives the base
// its weights and the adapters the values any layout starts from.
generate::FullCheckpoint with_initial_adapters(const generate::FullCheckpoint& base, const model::GptStage& stage,
                                               int tp_size) {
  generate::FullCheckpoint out = base;  // shares the tensors
  const model::GptConfig& c = stage.config();
  for (const auto& p : stage.parameters()) {
    if (!is_adapter(p)) continue;
    std::vector<int64_t> shape = p.tensor.sizes().vec();
    if (p.tensor_parallel()) shape[p.partition_dim] *= tp_size;
    const bool a = p.name.find(".lora_a.") != std::string::npos;
    // host: full initial values, sliced by fill_stage_parameters
    out.params[p.name] = a ? model::initial_lora_a(c.seed, adapted_linear(p.name), shape[0], shape[1]) : at::zeros(shape);
  }
  return out;
}

// A digest of this rank's base parameters (ptune's digest over them as named tensors).
std::string base_digest(const std::vector<model::GptStage>& chunks) {
  generate::FullCheckpoint view;
  for (const auto& chunk : chunks)
    for (const auto& p : chunk.parameters())
      if (!is_adapter(p)) view.params[p.name] = p.tensor.detach();
  return ptune::checkpoint_digest(view);
}

class LoraTask : public train::TrainingTask {
 public:
  explicit LoraTask(LoraRunPlan plan) : plan_(std::move(plan)), r_(plan_.recipe), data_(train::make_pretraining_task(r_)) {}

  std::string command() const override { return "loom finetune"; }
  const config::Recipe& recipe() const override { return r_; }
  std::string run_label() const override {
    const auto& l = r_.model.peft.lora_tuning;
    return fmt::format("LoRA fine-tuning (r={}, alpha={}, {}) on ", l.adapter_dim,
                       l.alpha.value_or(double(l.adapter_dim)), fmt::join(l.target_modules, ", "));
  }
  void prepare_data(train::TaskContext& ctx) override { data_->prepare_data(ctx); }
  train::TaskModel build_model(train::TaskContext& ctx) override;
  void attach_optimizer(train::TaskContext& ctx, train::TaskModel& model, train::optim::Optimizer& optimizer) override;
  train::CheckpointLayout checkpoint_layout(const train::TaskContext& ctx, const train::TaskModel& model) const override;
  std::vector<train::MicroBatch> step_micro_batches(train::TaskContext& ctx, int64_t step,
                                                    int64_t consumed_samples) override {
    return data_->step_micro_batches(ctx, step, consumed_samples);
  }
  bool has_validation() const override { return data_->has_validation(); }
  std::optional<double> validate(train::TaskContext& ctx, train::TaskModel& model, int64_t step) override {
    return data_->validate(ctx, model, step);
  }
  void before_finish(train::TaskContext& ctx, const train::TaskModel& model) override;

 private:
  LoraRunPlan plan_;
  const config::Recipe& r_;
  std::unique_ptr<train::TrainingTask> data_;  // the pretraining data (its model is never built)
  std::string base_checkpoint_digest_;          ///< the whole base checkpoint (the same for every layout)
  std::string base_digest_;                     ///< this rank's slice of the base, checked at the end
  int64_t adapter_parameters_ = 0;
};

train::TaskModel LoraTask::build_model(train::TaskContext& ctx) {
  train::TaskModel model;
  const auto& info = plan_.base.plan.info;
  model.config = train::gpt_config_from_recipe(r_, info.layout.model_shape.vocab_size);
  const generate::FullCheckpoint full = generate::read_full_checkpoint(plan_.base.plan.location.checkpoints, info);
  base_checkpoint_digest_ = ptune::checkpoint_digest(full);
  const int t = ctx.groups->layout().tensor_parallel();
  model.chunks = train::build_model_chunks(model.config, *ctx.groups, ctx.layout.vp, ctx.groups->device());
  for (const auto& chunk : model.chunks) {
    generate::fill_stage_parameters(with_initial_adapters(full, chunk, t), chunk, ctx.groups->coords().tp, t);
    for (const auto& p : chunk.parameters()) {
      if (is_adapter(p)) {
        model.trainable.push_back(p);
        adapter_parameters_ += p.tensor.numel();
      } else {
        p.tensor.requires_grad_(false);  // the frozen base: no gradients, never in the optimizer
      }
    }
  }
  base_digest_ = base_digest(model.chunks);
  model.checkpoint_trainable_only = true;  // adapter checkpoints: the base is never written
  // The frozen base runs forward and the input-gradient half of backward; the adapters' own
  // FLOPs (rank r << h) are not counted: 2/3 of a training iteration's model FLOPs.
  model.flops_fraction = 2.0 / 3.0;
  return model;
}

void LoraTask::attach_optimizer(train::TaskContext& ctx, train::TaskModel& model, train::optim::Optimizer&) {
  ctx.log->message(fmt::format("[loom] base: {} (iteration {}{}, {} layers, hidden {}, checkpoint digest {}), frozen; "
                               "{} trainable adapter parameters on rank 0",
                               plan_.base.path, plan_.base.plan.info.iteration,
                               plan_.base.pinned.empty() ? "" : ", " + plan_.base.pinned, model.config.num_layers,
                               model.config.hidden_size, base_checkpoint_digest_, adapter_parameters_));
  ctx.log->message("[loom] base parameters of this rank: digest " + base_digest_);
}

train::CheckpointLayout LoraTask::checkpoint_layout(const train::TaskContext& ctx, const train::TaskModel& model) const {
  train::CheckpointLayout l = train::checkpoint_layout(ctx.layout, model.config);
  // An adapter checkpoint names its base and its adapters; a resume must match both.
  LoraRecord record;
  record.base_checkpoints = fs::weakly_canonical(plan_.base.plan.location.checkpoints).string();
  record.base_iteration = plan_.base.plan.info.iteration;
  record.base_digest = base_checkpoint_digest_;
  record.lora = model.config.lora;
  l.task_record[kLoraRecordKey] = record.to_json();
  return l;
}

void LoraTask::before_finish(train::TaskContext& ctx, const train::TaskModel& model) {
  const std::string after = base_digest(model.chunks);
  if (after != base_digest_)
    throw std::logic_error("the frozen base changed during LoRA fine-tuning (digest " + base_digest_ + " -> " + after + ")");
  ctx.log->message("[loom] base parameters unchanged (digest " + after + ")");
}

}  // namespace

int run_lora_finetuning(const config::Recipe& recipe, const train::TrainOptions& options) {
  return train::run_training_task(
      [&] { return std::make_unique<LoraTask>(plan_lora_run(recipe, options.resume_iteration)); }, options);
}

}  // namespace loom::finetune
