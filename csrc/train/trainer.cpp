#include "train/trainer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "config/derived.h"
#include "data/gpt_data_factory.h"
#include "data/pretraining_sampler.h"
#include "data/recipe_tokenizer.h"
#include "launch/env_rendezvous.h"
#include "launch/local_launcher.h"
#include "runtime/cpu_threads.h"
#include "runtime/error_text.h"
#include "runtime/process_groups.h"
#include "runtime/run_device.h"
#include "train/checkpoint.h"
#include "planner/hardware.h"
#include "train/device_info.h"
#include "train/gpt_step.h"
#include "train/metrics_log.h"
#include "train/micro_batches.h"
#include "train/sample_prefetch.h"
#include "train/model_setup.h"
#include "train/param_gather_wait.h"
#include "train/optim/lr_schedule.h"
#include "train/optim/optimizer.h"
#include "train/run_directory.h"
#include "train/run_settings.h"
#include "train/step_log.h"
#include "train/step_loop.h"
#include "train/stop_signal.h"
#include "train/training_state.h"

namespace fs = std::filesystem;

namespace loom::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Everything one rank holds for the run. run() reads top-down: set up the device and the
// groups, the data, the model; resume; then train, validating and saving on schedule.
class TrainingRun {
 public:
  TrainingRun(const config::Recipe& recipe, const TrainOptions& options)
      : r_(recipe), options_(options) {}

  int run();
  /// After run() threw: writes this rank's step records not yet flushed (no collective).
  void keep_logged_steps() noexcept;

 private:
  void setup();
  void build_data();
  void build_model();
  void resume_if_possible();
  void train_step(int64_t step);
  void validate(int64_t step);
  void save(int64_t iteration);
  int finish();
  StepSampleIds next_sample_ids(data::PretrainingSampler& sampler) const;
  StepSampleIds train_sample_ids(int64_t consumed_samples) const;
  std::vector<MicroBatch> micro_batches(const StepSamples& samples) const;
  TrainingParts parts() { return {&chunks_, optimizer_.get(), scheduler_.get(), scaler_.get()}; }
  bool is_rank0() const { return groups_->rank() == 0; }

  config::Recipe r_;
  TrainOptions options_;
  Layout shape_;
  std::shared_ptr<runtime::ProcessGroups> groups_;
  std::unique_ptr<RunDirectory> dir_;
  std::unique_ptr<MetricsLog> log_;
  data::GptDatasets datasets_;
  std::unique_ptr<SamplePrefetcher> train_samples_;  // reads the next step's samples ahead
  model::GptConfig model_config_;
  std::vector<model::GptStage> chunks_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<optim::LrScheduler> scheduler_;
  std::unique_ptr<optim::LossScaler> scaler_;
  std::unique_ptr<GptStep> step_;
  std::unique_ptr<StepLog> step_log_;
  TrainingPosition position_;
  int64_t first_step_ = 0;  ///< the first step this process trains (after resume)
};

int TrainingRun::run() {
  setup();
  build_data();
  build_model();
  resume_if_possible();
  first_step_ = position_.iteration;
  dir_->write_resolved_recipe(r_);
  install_stop_signal_handlers();

  const StepLoopHooks hooks{[&](int64_t step) { train_step(step); }, [&](int64_t done) { validate(done); },
                            [&](int64_t done) { save(done); }};
  if (run_step_loop(r_, position_.iteration, options_.stop_after_steps, *groups_, *log_, hooks) !=
      StepLoopEnd::kMaxSteps)
    return finish();
  const int64_t max_steps = r_.trainer.max_steps;
  validate(max_steps);
  // NeMo's save_last: the last step is saved even off the every_n_steps grid; without it, only
  // the grid's steps are (Lightning's ModelCheckpoint).
  const auto& saving = r_.exp_manager.checkpoint_callback_params;
  if (saving.save_last || (saving.every_n_steps > 0 && max_steps % saving.every_n_steps == 0)) save(max_steps);
  return finish();
}

void TrainingRun::setup() {
  const auto info = launch::rendezvous_from_env();
  const int64_t world = config::world_size(r_);
  if (info.world_size != world) {
    throw std::invalid_argument(fmt::format(
        "the recipe asks for trainer.num_nodes × trainer.devices = {} ranks, but {} were started",
        world, info.world_size));
  }
  shape_ = config::recipe_layout(r_);
  runtime::use_fair_share_of_cores(info.local_world_size);
  // Before anything in the run directory is touched: one run per directory.
  dir_ = std::make_unique<RunDirectory>(run_directory_options(r_, "loom train", options_.resume_iteration),
                                        info.rank == 0);

  const runtime::ProcessGroupOptions pg = process_group_options(r_, info.local_rank);
  groups_ = runtime::ProcessGroups::create(info, pg);

  groups_->host_world().barrier();
  log_ = std::make_unique<MetricsLog>(
      is_rank0() ? (fs::path(dir_->run_dir()) / "metrics.jsonl").string() : "", is_rank0());
  dir_->attach(*groups_, *log_);
  log_->message(fmt::format("[loom] {} | t={} p={} v={} d={} | {} micro-batches of {} per step",
                            groups_->layout().describe(), shape_.tp, shape_.pp, shape_.vp, shape_.dp,
                            shape_.micro_batches(), shape_.micro_batch));
  log_->message("[loom] device: " + pg.device.describe());
}

void TrainingRun::build_data() {
  const int64_t train_samples = r_.trainer.max_steps * shape_.global_batch;
  const int64_t valid_samples =
      std::max<int64_t>(1, r_.trainer.limit_val_batches) * shape_.global_batch;
  auto cfg = gpt_data_config(r_, train_samples, valid_samples,
                             (fs::path(dir_->run_dir()) / "index_cache").string());
  // Rank 0 builds the index caches; the others then load them.
  if (is_rank0()) datasets_ = data::build_gpt_datasets(cfg);
  groups_->host_world().barrier();
  if (!is_rank0()) datasets_ = data::build_gpt_datasets(cfg);
  for (const auto& w : datasets_.warnings) log_->message("[loom] warning: " + w);
  if (!datasets_.train) throw std::invalid_argument("model.data.splits_string gives no training data");
  train_samples_ = std::make_unique<SamplePrefetcher>(*datasets_.train, r_.model.data.num_workers);
  log_->message(fmt::format("[loom] data: {} training samples, {} validation samples of {} tokens",
                            datasets_.train->size(), datasets_.valid ? datasets_.valid->size() : 0,
                            r_.model.data.seq_length));
}

void TrainingRun::build_model() {
  model_config_ = gpt_config_from_recipe(r_, data::recipe_vocab_size(r_.model.tokenizer));
  chunks_ = build_model_chunks(model_config_, *groups_, shape_.vp, groups_->device());
  optimizer_ = optim::Optimizer::create(chunk_parameters(chunks_), groups_, optimizer_options(r_));
  // model.optim.overlap_param_sync: each layer's forward waits for its own buckets' gathers.
  if (optimizer_->options().overlap_param_gather) wait_for_params_in_forward(chunks_, *optimizer_);
  scheduler_ = std::make_unique<optim::LrScheduler>(lr_schedule_config(r_));
  if (r_.trainer.precision == config::Precision::kFp16)
    scaler_ = std::make_unique<optim::LossScaler>(optim::LossScalerConfig{}, groups_->device());
  step_ = std::make_unique<GptStep>(chunks_, *groups_, shape_);

  StepLogConfig lc;
  lc.max_steps = r_.trainer.max_steps;
  lc.print_every = r_.trainer.log_every_n_steps;
  lc.tokens_per_step = shape_.global_batch * r_.model.data.seq_length;
  lc.model_flops_per_step = model_flops_per_step(model_config_, shape_);
  lc.world_size = groups_->layout().world_size();
  // MFU needs the accelerator's peak; CPUs have no entry in the table, so no MFU there.
  lc.peak_tflops = planner::peak_tflops_for_device(accelerator_name(groups_->device()));
  if (r_.trainer.max_time)
    if (const auto seconds = config::parse_max_time(*r_.trainer.max_time)) lc.max_time_s = double(*seconds);
  step_log_ = std::make_unique<StepLog>(lc, *groups_, is_rank0() ? log_.get() : nullptr);

  int64_t count = 0;
  for (const auto& p : optimizer_->params()) count += p.tensor.numel();
  log_->message(fmt::format("[loom] model: {} layers, hidden {}, {} parameters on rank 0",
                            model_config_.num_layers, model_config_.hidden_size, count));
}

void TrainingRun::resume_if_possible() {
  const auto point = dir_->resume(checkpoint_layout(shape_, model_config_));
  if (!point) return;
  position_ = restore_training_state(point->state, parts());
  log_->message(fmt::format("[loom] resumed from {} (step {}, {} samples consumed)", dir_->iteration_path(point->iteration),
                            position_.iteration, position_.consumed_samples));
}

// This rank's sample ids of up to m micro-batches (fewer where the data ends).
StepSampleIds TrainingRun::next_sample_ids(data::PretrainingSampler& sampler) const {
  StepSampleIds ids;
  for (int k = 0; k < shape_.micro_batches(); ++k) {
    auto next = sampler.next();
    if (!next) break;
    ids.push_back(std::move(*next));
  }
  return ids;
}

StepSampleIds TrainingRun::train_sample_ids(int64_t consumed_samples) const {
  data::PretrainingSampler sampler(datasets_.train->size(), consumed_samples, shape_.micro_batch,
                                   groups_->coords().dp, shape_.dp);
  return next_sample_ids(sampler);
}

std::vector<MicroBatch> TrainingRun::micro_batches(const StepSamples& samples) const {
  std::vector<MicroBatch> out;
  const int dp_rank = groups_->coords().dp;
  for (size_t k = 0; k < samples.size(); ++k) {
    const int64_t row = micro_batch_global_row(int64_t(k), shape_.dp, dp_rank, shape_.micro_batch);
    out.push_back(make_micro_batch(samples[k], row, groups_->device()));
  }
  return out;
}

void TrainingRun::train_step(int64_t step) {
  const auto start = Clock::now();
  step_log_->begin_step();
  const StepSampleIds ids = train_sample_ids(position_.consumed_samples);
  if (int(ids.size()) != shape_.micro_batches()) throw std::runtime_error("training data exhausted");
  auto batches = micro_batches(train_samples_->take(ids));
  // model.data.num_workers threads read the next step's samples while this one computes.
  const int64_t next = position_.consumed_samples + shape_.global_batch;
  if (step + 1 < r_.trainer.max_steps && next < datasets_.train->size()) train_samples_->prefetch(train_sample_ids(next));

  model::DropoutContext dropout;
  dropout.seed = static_cast<uint64_t>(r_.model.seed);
  dropout.step = static_cast<uint64_t>(step);
  dropout.global_batch = shape_.global_batch;
  dropout.training = true;
  optimizer_->start_iteration(shape_.micro_batches());
  at::Tensor loss = step_->train(batches, dropout, scaler_ ? scaler_->scale_tensor() : at::Tensor(),
                                 [&] { optimizer_->accumulate_grads(); });
  const optim::StepResult result = optimizer_->step(scheduler_->lr(), scaler_.get());
  if (step == first_step_) report_gradient_overlap(*optimizer_, *log_, step);
  scheduler_->advance();
  position_.iteration = step + 1;
  position_.consumed_samples += shape_.global_batch;
  step_log_->add(step + 1, loss, result, scheduler_->lr(), seconds_since(start),
                 position_.consumed_samples);
}

void TrainingRun::validate(int64_t step) {
  if (!datasets_.valid || r_.trainer.limit_val_batches <= 0) return;
  optimizer_->wait_for_params();  // model.optim.overlap_param_sync leaves the last gather open
  step_log_->flush();
  const auto start = Clock::now();
  data::PretrainingSampler sampler(datasets_.valid->size(), 0, shape_.micro_batch,
                                   groups_->coords().dp, shape_.dp);
  at::Tensor totals = at::zeros({2}, at::TensorOptions().dtype(at::kDouble).device(groups_->device()));
  int64_t batches_done = 0;
  at::NoGradGuard no_grad;
  for (int64_t b = 0; b < r_.trainer.limit_val_batches; ++b) {
    auto batches = micro_batches(read_step_samples(*datasets_.valid, next_sample_ids(sampler), 1));
    if (int(batches.size()) != shape_.micro_batches()) break;
    totals += step_->evaluate(batches);
    ++batches_done;
  }
  const at::Tensor sums = step_->reduce_totals(totals).to(at::kCPU);
  const double loss = sums[0].item<double>() / std::max(1.0, sums[1].item<double>());
  if (is_rank0())
    log_->write({{"kind", "validation"}, {"step", step}, {"max_steps", r_.trainer.max_steps},
                 {"val_loss", loss}, {"val_batches", batches_done},
                 {"val_time_s", seconds_since(start)}},
                true);
}

void TrainingRun::save(int64_t iteration) {
  step_log_->flush();  // a non-finite loss stops the run before it is saved
  optimizer_->wait_for_params();
  dir_->save(iteration, checkpoint_layout(shape_, model_config_),
             [&] { return capture_training_state(parts(), position_, groups_->coords().tp, shape_.tp); });
}

// On the error path: the steps done since the last flush are still device tensors in the step
// log; write this rank's records (no collective: peers may be gone) so that a run that fails
// keeps the losses of the steps it did. Best effort: the error being reported matters more.
void TrainingRun::keep_logged_steps() noexcept {
  if (step_log_) step_log_->keep_unflushed_steps();
}

int TrainingRun::finish() {
  step_log_->flush();
  log_->print_summary();
  groups_->host_world().barrier();
  groups_->shutdown();
  return 0;
}

}  // namespace

int run_training(const config::Recipe& recipe, const TrainOptions& options) {
  TrainingRun run(recipe, options);
  try {
    return run.run();
  } catch (const std::exception& e) {
    // Recorded while this rank's groups are still open: once `run` unwinds, its sockets close
    // and the peers fail too, and the launcher must see that this error came first.
    launch::record_rank_error(runtime::error_text(e));
    run.keep_logged_steps();
    throw;
  }
}

}  // namespace loom::train
