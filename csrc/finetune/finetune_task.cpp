#include "finetune/finetune_task.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <filesystem>
#include <memory>

#include "convert/hf_files.h"
#include "data/pretraining_sampler.h"
#include "finetune/full_run_recipe.h"
#include "finetune/lora_run.h"
#include "finetune/sft_rows.h"
#include "generate/checkpoint_reader.h"
#include "generate/model_loader.h"
#include "model/init.h"
#include "model/lora.h"
#include "prompt_data/epoch_order.h"
#include "ptune/answer_metrics.h"
#include "ptune/frozen_base.h"
#include "train/gpt_step.h"
#include "train/metrics_log.h"
#include "train/model_setup.h"
#include "train/optim/optimizer.h"
#include "train/checkpoint_files.h"
#include "train/run_directory.h"

namespace fs = std::filesystem;

namespace loom::finetune {
namespace {

using Clock = std::chrono::steady_clock;

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

// Rows of SFT examples as the training step takes them, plus the answer mask for exact match.
struct SftMicroBatch {
  train::MicroBatch mb;
  at::Tensor answer_mask;  ///< [b, s] float32
};

class FinetuneTask : public train::TrainingTask {
 public:
  explicit FinetuneTask(FinetuneRunPlan plan) : plan_(std::move(plan)), r_(plan_.recipe) {}

  std::string command() const override { return "loom finetune"; }
  const config::Recipe& recipe() const override { return r_; }
  config::Recipe run_directory_recipe() const override {
    if (plan_.lora) return r_;
    return full_run_recipe(plan_).value_or(r_);
  }
  std::string run_label() const override {
    if (!plan_.lora) return "full-parameter fine-tuning (SFT) on ";
    const auto& l = r_.model.peft.lora_tuning;
    return fmt::format("LoRA fine-tuning (r={}, alpha={}, {}) on ", l.adapter_dim,
                       l.alpha.value_or(double(l.adapter_dim)), fmt::join(l.target_modules, ", "));
  }
  void prepare_data(train::TaskContext& ctx) override;
  train::TaskModel build_model(train::TaskContext& ctx) override;
  void attach_optimizer(train::TaskContext& ctx, train::TaskModel& model, train::optim::Optimizer& optimizer) override;
  train::CheckpointLayout checkpoint_layout(const train::TaskContext& ctx, const train::TaskModel& model) const override;
  std::vector<train::MicroBatch> step_micro_batches(train::TaskContext& ctx, int64_t step,
                                                    int64_t consumed_samples) override;
  bool has_validation() const override { return plan_.valid != nullptr; }
  std::optional<double> validate(train::TaskContext& ctx, train::TaskModel& model, int64_t step) override;
  void before_finish(train::TaskContext& ctx, const train::TaskModel& model) override;

 private:
  SftMicroBatch micro_batch(const train::TaskContext& ctx, const std::vector<std::vector<const SftExample*>>& rows,
                            bool packed, int64_t global_row) const;

  FinetuneRunPlan plan_;
  const config::Recipe& r_;
  std::unique_ptr<prompt_data::EpochOrder> order_;
  std::string base_checkpoint_digest_;  ///< the whole base checkpoint (the same for every layout)
  std::string base_digest_;             ///< LoRA: this rank's slice of the base, checked at the end
  int64_t trainable_parameters_ = 0;
};

void FinetuneTask::prepare_data(train::TaskContext& ctx) {
  std::string packing;
  if (plan_.packing)
    packing = fmt::format("; packed into {} rows of {} positions by first-fit decreasing, packing efficiency {:.1f}%",
                          plan_.packing->packs.size(), plan_.seq_length, 100.0 * plan_.packing->efficiency());
  ctx.log->message("[loom] data: train " + plan_.train->summary() +
                   (plan_.valid ? "; validation " + plan_.valid->summary() : std::string()) +
                   fmt::format("; sequence length {}", plan_.seq_length) + packing);
  if (plan_.packing && ctx.is_rank0())
    ctx.log->write({{"kind", "packing"}, {"rows", static_cast<int64_t>(plan_.packing->packs.size())},
                    {"examples", plan_.train->size()}, {"seq_length", plan_.seq_length},
                    {"efficiency", plan_.packing->efficiency()}},
                   false);
  order_ = std::make_unique<prompt_data::EpochOrder>(plan_.train_samples(), static_cast<uint64_t>(r_.model.seed),
                                                     /*shuffle=*/true);
  // A full fine-tuning run's config.yaml is the model's recipe (run_directory_recipe): the
  // fine-tuning recipe is kept beside it.
  if (!plan_.lora && ctx.is_rank0()) {
    const fs::path run(ctx.dir->run_dir());
    train::write_text_atomically((run / "finetune_config.yaml").string(), config::to_yaml(r_));
    // The chat template chat records were rendered with, where loom serve's chat completions
    // find a run's own (RUN/tokenizer/chat_template.jinja).
    if (plan_.chat_template_file) {
      fs::create_directories(run / "tokenizer");
      fs::copy_file(*plan_.chat_template_file, run / "tokenizer" / convert::kHfChatTemplateFile,
                    fs::copy_options::overwrite_existing);
    }
  }
}

train::TaskModel FinetuneTask::build_model(train::TaskContext& ctx) {
  train::TaskModel model;
  const auto& info = plan_.base.plan.info;
  model.config = train::gpt_config_from_recipe(r_, info.layout.model_shape.vocab_size);
  const generate::FullCheckpoint full = generate::read_full_checkpoint(plan_.base.plan.location.checkpoints, info);
  base_checkpoint_digest_ = ptune::checkpoint_digest(full);
  const int t = ctx.groups->layout().tensor_parallel();
  model.chunks = train::build_model_chunks(model.config, *ctx.groups, ctx.layout.vp, ctx.groups->device());
  for (const auto& chunk : model.chunks) {
    generate::fill_stage_parameters(plan_.lora ? with_initial_adapters(full, chunk, t) : full, chunk,
                                    ctx.groups->coords().tp, t);
    for (const auto& p : chunk.parameters()) {
      if (!plan_.lora || is_adapter(p)) {
        model.trainable.push_back(p);
        trainable_parameters_ += p.tensor.numel();
      } else {
        p.tensor.requires_grad_(false);  // the frozen base: no gradients, never in the optimizer
      }
    }
  }
  if (!plan_.lora) return model;  // whole-model checkpoints, a training iteration's FLOPs
  base_digest_ = base_digest(model.chunks);
  model.checkpoint_trainable_only = true;  // adapter checkpoints: the base is never written
  // The frozen base runs forward and the input-gradient half of backward; the adapters' own
  // FLOPs (rank r << h) are not counted: 2/3 of a training iteration's model FLOPs.
  model.flops_fraction = 2.0 / 3.0;
  return model;
}

void FinetuneTask::attach_optimizer(train::TaskContext& ctx, train::TaskModel& model, train::optim::Optimizer&) {
  ctx.log->message(fmt::format("[loom] base: {} (iteration {}{}, {} layers, hidden {}, checkpoint digest {}), {}; "
                               "{} trainable {}parameters on rank 0",
                               plan_.base.path, plan_.base.plan.info.iteration,
                               plan_.base.pinned.empty() ? "" : ", " + plan_.base.pinned, model.config.num_layers,
                               model.config.hidden_size, base_checkpoint_digest_, plan_.lora ? "frozen" : "trained whole",
                               trainable_parameters_, plan_.lora ? "adapter " : ""));
  if (plan_.lora) ctx.log->message("[loom] base parameters of this rank: digest " + base_digest_);
}

train::CheckpointLayout FinetuneTask::checkpoint_layout(const train::TaskContext& ctx,
                                                        const train::TaskModel& model) const {
  train::CheckpointLayout l = train::checkpoint_layout(ctx.layout, model.config);
  if (!plan_.lora) return l;  // a whole model: a pretraining checkpoint's layout
  // An adapter checkpoint names its base and its adapters; a resume must match both.
  LoraRecord record;
  record.base_checkpoints = fs::weakly_canonical(plan_.base.plan.location.checkpoints).string();
  record.base_iteration = plan_.base.plan.info.iteration;
  record.base_digest = base_checkpoint_digest_;
  record.lora = model.config.lora;
  l.task_record[kLoraRecordKey] = record.to_json();
  return l;
}

SftMicroBatch FinetuneTask::micro_batch(const train::TaskContext& ctx,
                                        const std::vector<std::vector<const SftExample*>>& rows, bool packed,
                                        int64_t global_row) const {
  const SftRows b = make_sft_rows(rows, plan_.seq_length, plan_.tokenizer->pad_id(), r_.model.answer_only_loss, packed);
  const at::Device device = ctx.groups->device();
  const std::vector<int64_t> shape{b.rows, b.seq_length};
  auto to_device = [&](at::Tensor host) {
    if (device.is_cpu()) return host;
    return host.pin_memory().to(device, /*non_blocking=*/true);
  };
  SftMicroBatch out;
  // host: each array below is built on the host and copied once
  out.mb.tokens = to_device(at::tensor(b.tokens, at::kLong).view(shape));
  // host: as above
  out.mb.labels = to_device(at::tensor(b.labels, at::kLong).view(shape));
  // host: as above
  out.mb.loss_mask = to_device(at::tensor(b.loss_mask, at::kFloat).view(shape));
  // host: as above
  out.mb.position_ids = to_device(at::tensor(b.position_ids, at::kLong).view(shape));
  // host: as above
  if (packed) out.mb.segment_ids = to_device(at::tensor(b.segment_ids, at::kLong).view(shape));
  // host: as above
  out.answer_mask = to_device(at::tensor(b.answer_mask, at::kFloat).view(shape));
  out.mb.global_row = global_row;
  return out;
}

std::vector<train::MicroBatch> FinetuneTask::step_micro_batches(train::TaskContext& ctx, int64_t step,
                                                                int64_t consumed_samples) {
  const Layout& s = ctx.layout;
  const int64_t stream = r_.trainer.max_steps * s.global_batch;
  data::PretrainingSampler sampler(stream, consumed_samples, s.micro_batch, ctx.groups->coords().dp, s.dp);
  std::vector<train::MicroBatch> batches;
  for (int k = 0; k < s.micro_batches(); ++k) {
    auto ids = sampler.next();
    if (!ids) throw std::logic_error("fine-tuning: the sample stream ended before trainer.max_steps");
    std::vector<std::vector<const SftExample*>> rows;
    for (const int64_t i : *ids) {  // stream index -> sample (a packed row, or an example)
      const int64_t sample = (*order_)[i];
      std::vector<const SftExample*> row;
      if (plan_.packing)
        for (const int64_t e : plan_.packing->packs[static_cast<size_t>(sample)]) row.push_back(&(*plan_.train)[e]);
      else
        row.push_back(&(*plan_.train)[sample]);
      rows.push_back(std::move(row));
    }
    const int64_t row = train::micro_batch_global_row(int64_t(k), s.dp, ctx.groups->coords().dp, s.micro_batch);
    batches.push_back(micro_batch(ctx, rows, plan_.packing.has_value(), row).mb);
  }
  (void)step;
  return batches;
}

// Validation scores the validation examples one per row (never packed), over whole global
// batches (at most trainer.limit_val_batches), with the training loss rule: [Σ masked token
// loss, Σ loss-mask tokens, Σ exactly answered examples, examples] (ptune/answer_metrics.h).
std::optional<double> FinetuneTask::validate(train::TaskContext& ctx, train::TaskModel& model, int64_t step) {
  const auto start = Clock::now();
  at::NoGradGuard no_grad;
  const Layout& s = ctx.layout;
  const SftDataset& dataset = *plan_.valid;
  const bool last_stage = ctx.groups->coords().pp == s.pp - 1;
  train::ScheduleConfig sc = train::gpt_schedule(model.config, s, ctx.groups->device(), /*forward_only=*/true);
  at::Tensor totals = at::zeros({4}, at::TensorOptions().dtype(at::kDouble).device(ctx.groups->device()));
  data::PretrainingSampler sampler(dataset.size(), 0, s.micro_batch, ctx.groups->coords().dp, s.dp);
  model::DropoutContext off;
  off.training = false;
  const int64_t whole = dataset.size() / s.global_batch;
  const int64_t limit = r_.trainer.limit_val_batches > 0 ? std::min(whole, r_.trainer.limit_val_batches) : whole;
  for (int64_t g = 0; g < limit; ++g) {
    std::vector<SftMicroBatch> batches;
    for (int k = 0; k < s.micro_batches(); ++k) {
      std::vector<std::vector<const SftExample*>> rows;
      const auto ids = sampler.next();
      for (const int64_t i : *ids) rows.push_back({&dataset[i]});
      const int64_t row = train::micro_batch_global_row(int64_t(k), s.dp, ctx.groups->coords().dp, s.micro_batch);
      batches.push_back(micro_batch(ctx, rows, false, row));
    }
    auto result = train::run_pipeline_schedule(sc, ctx.groups->pipeline_links(), [&](int chunk, int k, const at::Tensor& in) {
      const auto& stage = model.chunks[chunk];
      const auto& b = batches[k];
      model::StageInputs inputs;
      if (stage.layout().pre_process) {
        inputs.tokens = b.mb.tokens;
        inputs.position_ids = b.mb.position_ids;
      } else {
        inputs.hidden = in;
      }
      at::Tensor out = stage.forward(inputs, off);  // logits on the last stage (no labels)
      if (!stage.layout().post_process) return out;
      return ptune::answer_totals(out, b.mb.labels, b.mb.loss_mask, b.answer_mask, ctx.groups->tensor_ptr(),
                                  model.config.vocab_size);
    });
    if (last_stage)
      for (const auto& t : result.losses) totals += t;
  }
  if (limit == 0) {
    ctx.log->message(fmt::format("[loom] validation: fewer than one global batch ({}) of examples: not scored",
                                 s.global_batch));
    return std::nullopt;
  }
  const at::Tensor sums = ctx.step->reduce_totals(totals).to(at::kCPU);
  const double loss = sums[0].item<double>() / std::max(1.0, sums[1].item<double>());
  const double examples = sums[3].item<double>();
  if (ctx.is_rank0())
    ctx.log->write({{"kind", "validation"}, {"step", step}, {"max_steps", r_.trainer.max_steps}, {"val_loss", loss},
                    {"val_accuracy", examples > 0 ? sums[2].item<double>() / examples : 0.0},
                    {"val_examples", static_cast<int64_t>(examples)}, {"val_batches", limit},
                    {"val_time_s", train::seconds_since(start)}},
                   true);
  return loss;
}

void FinetuneTask::before_finish(train::TaskContext& ctx, const train::TaskModel& model) {
  if (!plan_.lora) return;
  const std::string after = base_digest(model.chunks);
  if (after != base_digest_)
    throw std::logic_error("the frozen base changed during LoRA fine-tuning (digest " + base_digest_ + " -> " + after + ")");
  ctx.log->message("[loom] base parameters unchanged (digest " + after + ")");
}

}  // namespace

int run_finetuning(const config::Recipe& recipe, const train::TrainOptions& options) {
  return train::run_training_task(
      [&] { return std::make_unique<FinetuneTask>(plan_finetune_run(recipe, options.resume_iteration)); }, options);
}

}  // namespace loom::finetune
