#include "train/pretraining_task.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <memory>

#include "data/gpt_data_factory.h"
#include "data/pretraining_sampler.h"
#include "data/recipe_tokenizer.h"
#include "train/gpt_step.h"
#include "train/metrics_log.h"
#include "train/model_setup.h"
#include "train/optim/optimizer.h"
#include "train/param_gather_wait.h"
#include "train/sample_prefetch.h"

namespace fs = std::filesystem;

namespace loom::train {
namespace {

using Clock = std::chrono::steady_clock;

class PretrainingTask : public TrainingTask {
 public:
  explicit PretrainingTask(const config::Recipe& recipe) : r_(recipe) {}

  std::string command() const override { return "loom train"; }
  const config::Recipe& recipe() const override { return r_; }
  void prepare_data(TaskContext& ctx) override;
  TaskModel build_model(TaskContext& ctx) override;
  void attach_optimizer(TaskContext& ctx, TaskModel& model, optim::Optimizer& optimizer) override;
  std::vector<MicroBatch> step_micro_batches(TaskContext& ctx, int64_t step, int64_t consumed_samples) override;
  bool has_validation() const override { return datasets_.valid != nullptr; }
  std::optional<double> validate(TaskContext& ctx, TaskModel& model, int64_t step) override;

 private:
  StepSampleIds next_sample_ids(const Layout& layout, data::PretrainingSampler& sampler) const;
  StepSampleIds train_sample_ids(const TaskContext& ctx, int64_t consumed_samples) const;
  std::vector<MicroBatch> micro_batches(const TaskContext& ctx, const StepSamples& samples) const;

  const config::Recipe& r_;
  data::GptDatasets datasets_;
  std::unique_ptr<SamplePrefetcher> train_samples_;  // reads the next step's samples ahead
};

void PretrainingTask::prepare_data(TaskContext& ctx) {
  const Layout& s = ctx.layout;
  const int64_t train_samples = r_.trainer.max_steps * s.global_batch;
  const int64_t valid_samples = std::max<int64_t>(1, r_.trainer.limit_val_batches) * s.global_batch;
  auto cfg = gpt_data_config(r_, train_samples, valid_samples, (fs::path(ctx.dir->run_dir()) / "index_cache").string());
  // Rank 0 builds the index caches; the others then load them.
  if (ctx.is_rank0()) datasets_ = data::build_gpt_datasets(cfg);
  ctx.groups->host_world().barrier();
  if (!ctx.is_rank0()) datasets_ = data::build_gpt_datasets(cfg);
  for (const auto& w : datasets_.warnings) ctx.log->message("[loom] warning: " + w);
  if (!datasets_.train) throw std::invalid_argument("model.data.splits_string gives no training data");
  train_samples_ = std::make_unique<SamplePrefetcher>(*datasets_.train, r_.model.data.num_workers);
  ctx.log->message(fmt::format("[loom] data: {} training samples, {} validation samples of {} tokens",
                               datasets_.train->size(), datasets_.valid ? datasets_.valid->size() : 0, r_.model.data.seq_length));
}

TaskModel PretrainingTask::build_model(TaskContext& ctx) {
  TaskModel model;
  model.config = gpt_config_from_recipe(r_, data::recipe_vocab_size(r_.model.tokenizer));
  model.chunks = build_model_chunks(model.config, *ctx.groups, ctx.layout.vp, ctx.groups->device());
  model.trainable = chunk_parameters(model.chunks);
  return model;
}

void PretrainingTask::attach_optimizer(TaskContext& ctx, TaskModel& model, optim::Optimizer& optimizer) {
  // model.optim.overlap_param_sync: each layer's forward waits for its own buckets' gathers.
  if (optimizer.options().overlap_param_gather) wait_for_params_in_forward(model.chunks, optimizer);
  int64_t count = 0;
  for (const auto& p : optimizer.params()) count += p.tensor.numel();
  ctx.log->message(fmt::format("[loom] model: {} layers, hidden {}, {} parameters on rank 0", model.config.num_layers,
                               model.config.hidden_size, count));
}

// This rank's sample ids of up to m micro-batches (fewer where the data ends).
StepSampleIds PretrainingTask::next_sample_ids(const Layout& layout, data::PretrainingSampler& sampler) const {
  StepSampleIds ids;
  for (int k = 0; k < layout.micro_batches(); ++k) {
    auto next = sampler.next();
    if (!next) break;
    ids.push_back(std::move(*next));
  }
  return ids;
}

StepSampleIds PretrainingTask::train_sample_ids(const TaskContext& ctx, int64_t consumed_samples) const {
  data::PretrainingSampler sampler(datasets_.train->size(), consumed_samples, ctx.layout.micro_batch,
                                   ctx.groups->coords().dp, ctx.layout.dp);
  return next_sample_ids(ctx.layout, sampler);
}

std::vector<MicroBatch> PretrainingTask::micro_batches(const TaskContext& ctx, const StepSamples& samples) const {
  std::vector<MicroBatch> out;
  const int dp_rank = ctx.groups->coords().dp;
  for (size_t k = 0; k < samples.size(); ++k) {
    const int64_t row = micro_batch_global_row(int64_t(k), ctx.layout.dp, dp_rank, ctx.layout.micro_batch);
    out.push_back(make_micro_batch(samples[k], row, ctx.groups->device()));
  }
  return out;
}

std::vector<MicroBatch> PretrainingTask::step_micro_batches(TaskContext& ctx, int64_t step, int64_t consumed_samples) {
  const StepSampleIds ids = train_sample_ids(ctx, consumed_samples);
  if (int(ids.size()) != ctx.layout.micro_batches()) throw std::runtime_error("training data exhausted");
  auto batches = micro_batches(ctx, train_samples_->take(ids));
  // model.data.num_workers threads read the next step's samples while this one computes.
  const int64_t next = consumed_samples + ctx.layout.global_batch;
  if (step + 1 < r_.trainer.max_steps && next < datasets_.train->size())
    train_samples_->prefetch(train_sample_ids(ctx, next));
  return batches;
}

std::optional<double> PretrainingTask::validate(TaskContext& ctx, TaskModel& model, int64_t step) {
  const auto start = Clock::now();
  const Layout& s = ctx.layout;
  data::PretrainingSampler sampler(datasets_.valid->size(), 0, s.micro_batch, ctx.groups->coords().dp, s.dp);
  at::Tensor totals = at::zeros({2}, at::TensorOptions().dtype(at::kDouble).device(ctx.groups->device()));
  int64_t batches_done = 0;
  at::NoGradGuard no_grad;
  for (int64_t b = 0; b < r_.trainer.limit_val_batches; ++b) {
    auto batches = micro_batches(ctx, read_step_samples(*datasets_.valid, next_sample_ids(s, sampler), 1));
    if (int(batches.size()) != s.micro_batches()) break;
    totals += ctx.step->evaluate(batches);
    ++batches_done;
  }
  const at::Tensor sums = ctx.step->reduce_totals(totals).to(at::kCPU);
  const double loss = sums[0].item<double>() / std::max(1.0, sums[1].item<double>());
  if (ctx.is_rank0())
    ctx.log->write({{"kind", "validation"}, {"step", step}, {"max_steps", r_.trainer.max_steps}, {"val_loss", loss},
                    {"val_batches", batches_done}, {"val_time_s", seconds_since(start)}},
                   true);
  return loss;
}

}  // namespace

int run_training(const config::Recipe& recipe, const TrainOptions& options) {
  return run_training_task([&] { return make_pretraining_task(recipe); }, options);
}

std::unique_ptr<TrainingTask> make_pretraining_task(const config::Recipe& recipe) {
  return std::make_unique<PretrainingTask>(recipe);
}

}  // namespace loom::train
