#include "ptune/prompt_task.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <limits>
#include <memory>

#include "data/pretraining_sampler.h"
#include "data/recipe_tokenizer.h"
#include "generate/checkpoint_reader.h"
#include "prompt_data/epoch_order.h"
#include "prompt_data/prompt_batch.h"
#include "ptune/answer_metrics.h"
#include "ptune/prompt_model.h"
#include "ptune/prompt_run.h"
#include "train/gpt_step.h"
#include "train/metrics_log.h"
#include "train/model_setup.h"
#include "train/optim/optimizer.h"

namespace fs = std::filesystem;

namespace loom::ptune {
namespace {

using Clock = std::chrono::steady_clock;

using train::seconds_since;

const char* style_name(config::VirtualPromptStyle style) {
  return style == config::VirtualPromptStyle::kPTuning ? "p-tuning" : "prompt-tuning";
}

// A micro-batch of prompt rows as the training step takes it, plus the answer mask for the
// exact-match check.
struct PromptMicroBatch {
  train::MicroBatch mb;
  at::Tensor answer_mask;  ///< [b, s] float32
};

class PromptTask : public train::TrainingTask {
 public:
  explicit PromptTask(PromptRunPlan plan) : plan_(std::move(plan)), r_(plan_.recipe) {}

  std::string command() const override { return "loom ptune"; }
  const config::Recipe& recipe() const override { return r_; }
  std::string run_label() const override {
    return fmt::format("prompt learning ({}) on ", style_name(r_.model.prompt.virtual_prompt_style));
  }
  void prepare_data(train::TaskContext& ctx) override;
  train::TaskModel build_model(train::TaskContext& ctx) override;
  void attach_optimizer(train::TaskContext& ctx, train::TaskModel& model, train::optim::Optimizer& optimizer) override;
  train::CheckpointLayout checkpoint_layout(const train::TaskContext& ctx, const train::TaskModel& model) const override;
  void after_resume(train::TaskContext& ctx) override;
  std::vector<train::MicroBatch> step_micro_batches(train::TaskContext& ctx, int64_t step,
                                                    int64_t consumed_samples) override;
  bool has_validation() const override { return plan_.valid != nullptr; }
  std::optional<double> validate(train::TaskContext& ctx, train::TaskModel& model, int64_t step) override;
  void at_end(train::TaskContext& ctx, train::TaskModel& model, int64_t max_steps,
              std::optional<double> val_loss) override;
  void before_finish(train::TaskContext& ctx, const train::TaskModel& model) override;

 private:
  at::Tensor evaluate(train::TaskContext& ctx, train::TaskModel& model, const prompt_data::PromptDataset& dataset,
                      int64_t max_global_batches, int64_t& batches_done);
  void test(train::TaskContext& ctx, train::TaskModel& model, int64_t iteration);
  void write_tables(train::TaskContext& ctx, const std::string& dir, int64_t iteration, double val_loss);
  PromptMicroBatch micro_batch(const train::TaskContext& ctx, const prompt_data::PromptDataset& dataset,
                               const std::vector<int64_t>& ids, int64_t row, bool training, uint64_t step);

  PromptRunPlan plan_;
  const config::Recipe& r_;
  std::unique_ptr<PromptModel> prompt_;  // first pipeline stage only
  std::unique_ptr<prompt_data::EpochOrder> order_;
  std::string base_digest_;             ///< this rank's slice of the base, checked at the end
  std::string base_checkpoint_digest_;  ///< the whole base checkpoint (the same for every layout)
  double best_val_loss_ = std::numeric_limits<double>::infinity();
};

void PromptTask::prepare_data(train::TaskContext& ctx) {
  ctx.log->message("[loom] data: train " + plan_.train->summary() +
                   (plan_.valid ? "; validation " + plan_.valid->summary() : std::string()) +
                   fmt::format("; sequence length {}", plan_.seq_length));
  order_ = std::make_unique<prompt_data::EpochOrder>(plan_.train->size(), static_cast<uint64_t>(r_.model.seed),
                                                     /*shuffle=*/true);
}

train::TaskModel PromptTask::build_model(train::TaskContext& ctx) {
  train::TaskModel model;
  model.config = train::gpt_config_from_recipe(r_, static_cast<int64_t>(plan_.tokenizer->vocab_size()));
  const generate::FullCheckpoint full =
      generate::read_full_checkpoint(plan_.base.plan.location.checkpoints, plan_.base.plan.info);
  model.chunks = build_frozen_chunks(full, model.config, *ctx.groups, ctx.layout.vp);
  base_digest_ = parameters_digest(model.chunks);
  base_checkpoint_digest_ = checkpoint_digest(full);
  if (plan_.restored && plan_.restored->base.contains("checkpoint_digest") &&
      plan_.restored->base["checkpoint_digest"] != base_checkpoint_digest_)
    throw std::invalid_argument(fmt::format("model.restore_path: its tables were tuned on another base (checkpoint "
                                            "digest {}), model.language_model_path is {}",
                                            plan_.restored->base["checkpoint_digest"].get<std::string>(),
                                            base_checkpoint_digest_));
  if (ctx.groups->coords().pp == 0) {  // the prompt enters at the first pipeline stage's embeddings
    auto emb = full.params.find("embedding.word_embeddings.weight");
    if (emb == full.params.end())
      throw train::CheckpointError("model.language_model_path: the base checkpoint has no embedding.word_embeddings.weight");
    prompt_ = std::make_unique<PromptModel>(r_, plan_.templates, emb->second, *plan_.tokenizer,
                                            plan_.restored ? &*plan_.restored : nullptr, ctx.groups->tensor_ptr(),
                                            ctx.groups->device());
    model.trainable = prompt_->parameters();
  }
  model.checkpoint_trainable_only = true;  // the frozen base is never written
  // The frozen base runs forward and the input-gradient half of backward (its weights take no
  // gradients): 2/3 of a training iteration's model FLOPs (docs/design/ptuning.md, "The model").
  model.flops_fraction = 2.0 / 3.0;
  return model;
}

void PromptTask::attach_optimizer(train::TaskContext& ctx, train::TaskModel& model, train::optim::Optimizer&) {
  if (prompt_)
    ctx.log->message(fmt::format("[loom] base: {} (iteration {}{}, {} layers, hidden {}, checkpoint digest {}), "
                                 "frozen; {} trainable prompt parameters",
                                 plan_.base.path, plan_.base.plan.info.iteration,
                                 plan_.base.pinned.empty() ? "" : ", " + plan_.base.pinned, model.config.num_layers,
                                 model.config.hidden_size, base_checkpoint_digest_, prompt_->num_parameters()));
  ctx.log->message("[loom] base parameters of this rank: digest " + base_digest_);
}

train::CheckpointLayout PromptTask::checkpoint_layout(const train::TaskContext& ctx,
                                                      const train::TaskModel& model) const {
  train::CheckpointLayout l = train::checkpoint_layout(ctx.layout, model.config);
  // A prompt checkpoint names its base and what it trains; a resume must match.
  const auto& p = r_.model.prompt;
  l.task_record["prompt_learning"] = {
      {"base_checkpoints", fs::weakly_canonical(plan_.base.plan.location.checkpoints).string()},
      {"base_iteration", plan_.base.plan.info.iteration},
      {"virtual_prompt_style", style_name(p.virtual_prompt_style)},
      {"new_tasks", p.new_tasks}};
  return l;
}

void PromptTask::after_resume(train::TaskContext& ctx) {
  // The best validation loss so far is the one the best tables were written at.
  try {
    const auto best = read_prompt_tables((fs::path(ctx.dir->run_dir()) / "prompt_tables_best").string());
    if (best.val_loss >= 0) best_val_loss_ = best.val_loss;
  } catch (const std::invalid_argument&) {
    // none written yet
  }
}

PromptMicroBatch PromptTask::micro_batch(const train::TaskContext& ctx, const prompt_data::PromptDataset& dataset,
                                         const std::vector<int64_t>& ids, int64_t row, bool training, uint64_t step) {
  const prompt_data::PromptBatch b = prompt_data::make_prompt_batch(dataset, ids, plan_.seq_length);
  const at::Device device = ctx.groups->device();
  const std::vector<int64_t> shape{b.batch, b.seq_length};
  // host: rows are built on the host and copied once per micro-batch (pinned, non-blocking).
  auto to_device = [&](at::Tensor host) {
    if (device.is_cpu()) return host;
    return host.pin_memory().to(device, /*non_blocking=*/true);
  };
  PromptMicroBatch out;
  // host: each array below is built on the host and copied once
  out.mb.tokens = to_device(at::tensor(b.tokens, at::kLong).view(shape));
  // host: as above
  out.mb.labels = to_device(at::tensor(b.labels, at::kLong).view(shape));
  // host: as above
  out.mb.loss_mask = to_device(at::tensor(b.loss_mask, at::kFloat).view(shape));
  // host: as above
  out.mb.position_ids = to_device(at::arange(b.seq_length, at::kLong).unsqueeze(0).expand(shape).contiguous());
  out.mb.global_row = row;
  const std::vector<float> answer(b.answer_mask.begin(), b.answer_mask.end());
  // host: as above
  out.answer_mask = to_device(at::tensor(answer, at::kFloat).view(shape));
  if (prompt_) out.mb.prompt = prompt_->splice(b, 0, b.batch, training, step);
  return out;
}

std::vector<train::MicroBatch> PromptTask::step_micro_batches(train::TaskContext& ctx, int64_t step,
                                                              int64_t consumed_samples) {
  const Layout& s = ctx.layout;
  const int64_t stream = r_.trainer.max_steps * s.global_batch;
  data::PretrainingSampler sampler(stream, consumed_samples, s.micro_batch, ctx.groups->coords().dp, s.dp);
  std::vector<train::MicroBatch> batches;
  for (int k = 0; k < s.micro_batches(); ++k) {
    auto ids = sampler.next();
    if (!ids) throw std::logic_error("prompt learning: the sample stream ended before trainer.max_steps");
    for (auto& i : *ids) i = (*order_)[i];  // stream index -> example
    const int64_t row = train::micro_batch_global_row(int64_t(k), s.dp, ctx.groups->coords().dp, s.micro_batch);
    batches.push_back(micro_batch(ctx, *plan_.train, *ids, row, true, static_cast<uint64_t>(step)).mb);
  }
  return batches;
}

// [Σ masked token loss, Σ loss-mask tokens, Σ exact matches, examples] over whole global
// batches of `dataset` (at most max_global_batches when > 0), on every rank.
at::Tensor PromptTask::evaluate(train::TaskContext& ctx, train::TaskModel& model,
                                const prompt_data::PromptDataset& dataset, int64_t max_global_batches,
                                int64_t& batches_done) {
  at::NoGradGuard no_grad;
  const Layout& s = ctx.layout;
  const bool last_stage = ctx.groups->coords().pp == s.pp - 1;
  train::ScheduleConfig sc = train::gpt_schedule(model.config, s, ctx.groups->device(), /*forward_only=*/true);
  at::Tensor totals = at::zeros({4}, at::TensorOptions().dtype(at::kDouble).device(ctx.groups->device()));
  data::PretrainingSampler sampler(dataset.size(), 0, s.micro_batch, ctx.groups->coords().dp, s.dp);
  model::DropoutContext off;
  off.training = false;
  batches_done = 0;
  const int64_t whole = dataset.size() / s.global_batch;
  const int64_t limit = max_global_batches > 0 ? std::min(whole, max_global_batches) : whole;
  if (limit == whole && dataset.size() % s.global_batch != 0)
    ctx.log->message(fmt::format("[loom] warning: {} of the {} records are not scored (whole global batches of {} only)",
                                 dataset.size() % s.global_batch, dataset.size(), s.global_batch));
  for (int64_t g = 0; g < limit; ++g) {
    std::vector<PromptMicroBatch> batches;
    for (int k = 0; k < s.micro_batches(); ++k) {
      auto ids = sampler.next();
      const int64_t row = train::micro_batch_global_row(int64_t(k), s.dp, ctx.groups->coords().dp, s.micro_batch);
      batches.push_back(micro_batch(ctx, dataset, *ids, row, false, 0));
    }
    auto result = train::run_pipeline_schedule(sc, ctx.groups->pipeline_links(), [&](int chunk, int k, const at::Tensor& in) {
      const auto& stage = model.chunks[chunk];
      const auto& b = batches[k];
      model::StageInputs inputs;
      if (stage.layout().pre_process) {
        inputs.tokens = b.mb.tokens;
        inputs.position_ids = b.mb.position_ids;
        inputs.prompt = b.mb.prompt;
      } else {
        inputs.hidden = in;
      }
      at::Tensor out = stage.forward(inputs, off);  // logits on the last stage (no labels)
      if (!stage.layout().post_process) return out;
      return answer_totals(out, b.mb.labels, b.mb.loss_mask, b.answer_mask, ctx.groups->tensor_ptr(),
                           model.config.vocab_size);
    });
    if (last_stage)
      for (const auto& t : result.losses) totals += t;
    ++batches_done;
  }
  return ctx.step->reduce_totals(totals);
}

std::optional<double> PromptTask::validate(train::TaskContext& ctx, train::TaskModel& model, int64_t step) {
  const auto start = Clock::now();
  int64_t batches = 0;
  const at::Tensor sums = evaluate(ctx, model, *plan_.valid, r_.trainer.limit_val_batches, batches).to(at::kCPU);
  if (batches == 0) return std::nullopt;
  const double loss = sums[0].item<double>() / std::max(1.0, sums[1].item<double>());
  const double examples = sums[3].item<double>();
  const double accuracy = examples > 0 ? sums[2].item<double>() / examples : 0.0;
  if (ctx.is_rank0())
    ctx.log->write({{"kind", "validation"}, {"step", step}, {"max_steps", r_.trainer.max_steps}, {"val_loss", loss},
                    {"val_accuracy", accuracy}, {"val_examples", static_cast<int64_t>(examples)},
                    {"val_batches", batches}, {"val_time_s", seconds_since(start)}},
                   true);
  // World rank 0 (the one that writes the tables) decides, so that every rank joins the tables'
  // collective gather or none does. host: one flag on the host group.
  at::Tensor better = at::zeros({1}, at::kLong);
  if (ctx.is_rank0() && step > 0 && loss < best_val_loss_) better[0] = 1;
  ctx.groups->host_world().all_reduce(better);
  if (better.item<int64_t>() > 0) {
    best_val_loss_ = loss;
    write_tables(ctx, (fs::path(ctx.dir->run_dir()) / "prompt_tables_best").string(), step, loss);
  }
  return loss;
}

void PromptTask::at_end(train::TaskContext& ctx, train::TaskModel& model, int64_t max_steps,
                        std::optional<double> val_loss) {
  write_tables(ctx, prompt_tables_dir(ctx.dir->run_dir()), max_steps, val_loss.value_or(-1));
  test(ctx, model, max_steps);
}

void PromptTask::test(train::TaskContext& ctx, train::TaskModel& model, int64_t iteration) {
  if (!plan_.test) return;
  int64_t batches = 0;
  const at::Tensor sums = evaluate(ctx, model, *plan_.test, 0, batches).to(at::kCPU);
  if (batches == 0) {
    ctx.log->message(fmt::format("[loom] test: fewer than one global batch ({}) of examples: not evaluated",
                                 ctx.layout.global_batch));
    return;
  }
  const double examples = sums[3].item<double>();
  if (ctx.is_rank0())
    ctx.log->write({{"kind", "test"}, {"step", iteration},
                    {"test_loss", sums[0].item<double>() / std::max(1.0, sums[1].item<double>())},
                    {"test_accuracy", examples > 0 ? sums[2].item<double>() / examples : 0.0},
                    {"test_examples", static_cast<int64_t>(examples)}},
                   true);
}

void PromptTask::write_tables(train::TaskContext& ctx, const std::string& dir, int64_t iteration, double val_loss) {
  if (!prompt_) return;  // the tables live on the first pipeline stage
  PromptTables tables;
  tables.tasks = prompt_->tables();  // collective over the first stage's tensor group (tpmlp)
  if (!ctx.is_rank0()) return;
  tables.style = style_name(r_.model.prompt.virtual_prompt_style);
  tables.base = {{"path", plan_.base.path},
                 {"checkpoints", fs::weakly_canonical(plan_.base.plan.location.checkpoints).string()},
                 {"iteration", plan_.base.plan.info.iteration},
                 {"model_shape", plan_.base.plan.info.layout.model_json()},
                 {"checkpoint_digest", base_checkpoint_digest_},
                 // The tokenizer the records were laid out with (generate uses it by default).
                 {"tokenizer", tokenizer_record(data::tokenizer_spec(r_.model.tokenizer))}};
  tables.iteration = iteration;
  tables.val_loss = val_loss;
  tables.add_bos = r_.model.data.add_bos;
  tables.add_eos = r_.model.data.add_eos;
  write_prompt_tables(dir, tables);
  ctx.log->message(fmt::format("[loom] wrote the inference tables of {} to {}", tables.task_list(), dir));
}

void PromptTask::before_finish(train::TaskContext& ctx, const train::TaskModel& model) {
  const std::string after = parameters_digest(model.chunks);
  if (after != base_digest_)
    throw std::logic_error("the frozen base changed during prompt learning (digest " + base_digest_ + " -> " + after + ")");
  if (prompt_) ctx.log->message("[loom] base parameters unchanged (digest " + after + ")");
}

}  // namespace

int run_prompt_learning(const config::Recipe& recipe, const train::TrainOptions& options) {
  return train::run_training_task(
      [&] { return std::make_unique<PromptTask>(plan_prompt_run(recipe, options.resume_iteration)); }, options);
}

}  // namespace loom::ptune
