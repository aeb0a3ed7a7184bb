#include "train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "config/derived.h"
#include "data/gpt_data_factory.h"
#include "data/pretraining_sampler.h"
#include "launch/env_rendezvous.h"
#include "model/dropout_context.h"
#include "runtime/cpu_threads.h"
#include "runtime/process_groups.h"
#include "train/checkpoint.h"
#include "train/device_info.h"
#include "train/flops.h"
#include "train/metrics_log.h"
#include "train/micro_batches.h"
#include "train/model_setup.h"
#include "train/optim/lr_schedule.h"
#include "train/optim/optimizer.h"
#include "train/pipeline_schedule.h"

namespace fs = std::filesystem;

namespace loom::train {
namespace {

std::atomic<int> g_stop_signal{0};
extern "C" void loom_on_stop_signal(int sig) { g_stop_signal = sig; }

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double max_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;
}

data::GptDataConfig data_config(const config::Recipe& r, int64_t num_train_samples,
                                int64_t num_valid_samples, const std::string& cache_dir) {
  data::GptDataConfig c;
  const auto& blend = r.model.data.data_prefix;
  if (blend.size() == 1) {
    c.data_prefix = {blend[0].path};
  } else {
    for (const auto& e : blend) {
      c.data_prefix.push_back(fmt::format("{}", e.weight));
      c.data_prefix.push_back(e.path);
    }
  }
  c.splits_string = r.model.data.splits_string;
  c.seq_length = r.model.data.seq_length;
  c.seed = static_cast<uint32_t>(r.model.seed);
  c.num_samples = {num_train_samples, num_valid_samples, std::nullopt};
  c.eod_mask_loss = r.model.data.eod_mask_loss;
  c.index_cache_dir = r.model.data.index_mapping_dir.value_or(cache_dir);
  c.vocab_size = config::kGpt2VocabSize;
  return c;
}

// Everything one rank holds for the run.
class TrainingRun {
 public:
  TrainingRun(const config::Recipe& recipe, const TrainOptions& options)
      : r_(recipe), options_(options) {}

  int run();

 private:
  void setup();
  void build_data();
  void build_model();
  void maybe_resume();
  double train_step(int64_t step);      // returns the global mean loss (valid on rank 0)
  double validate(int64_t step);        // global validation loss (valid on rank 0)
  void save(int64_t iteration);
  bool stop_requested(int64_t steps_this_process);
  CheckpointLayout checkpoint_layout() const;
  at::Tensor forward_step(int chunk, const MicroBatch& mb, const at::Tensor& input,
                          const model::DropoutContext& ctx, bool validation);
  std::vector<MicroBatch> next_micro_batches(data::PretrainingSampler& sampler,
                                             const data::SampleDataset& dataset);
  void log_record(nlohmann::json record, bool print);

  config::Recipe r_;
  TrainOptions options_;
  std::shared_ptr<runtime::ProcessGroups> groups_;
  at::Device device_{at::kCPU};
  int t_ = 1, p_ = 1, v_ = 1, d_ = 1, m_ = 1;
  int64_t micro_ = 1, global_batch_ = 1, seq_ = 1;
  std::string run_dir_, checkpoint_dir_;
  data::GptDatasets datasets_;
  model::GptConfig model_config_;
  std::vector<model::GptStage> chunks_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<optim::LrScheduler> scheduler_;
  std::unique_ptr<optim::LossScaler> scaler_;
  std::unique_ptr<MetricsLog> log_;
  int64_t start_step_ = 0;
  int64_t consumed_samples_ = 0;
  bool is_last_stage_ = false;
  double global_tokens_ = 1;  // loss-mask tokens of the current global batch
  optim::StepResult last_step_;
};

void TrainingRun::setup() {
  const auto info = launch::rendezvous_from_env();
  const int64_t world = config::world_size(r_);
  if (info.world_size != world) {
    throw std::invalid_argument(fmt::format(
        "the recipe asks for trainer.num_nodes × trainer.devices = {} ranks, but {} were started",
        world, info.world_size));
  }
  t_ = int(r_.model.tensor_model_parallel_size);
  p_ = int(r_.model.pipeline_model_parallel_size);
  v_ = int(config::virtual_pipeline_size(r_));
  d_ = int(config::data_parallel_size(r_));
  m_ = int(config::num_microbatches(r_));
  micro_ = r_.model.micro_batch_size;
  global_batch_ = r_.model.global_batch_size;
  seq_ = r_.model.data.seq_length;

  runtime::use_fair_share_of_cores(info.local_world_size);

  runtime::ProcessGroupOptions pg;
  pg.tensor_parallel = t_;
  pg.pipeline_parallel = p_;
  pg.timeout = std::chrono::milliseconds(int64_t(r_.model.collective_timeout_s * 1000));
  if (r_.trainer.accelerator == config::Accelerator::kGpu) {
    pg.backend = runtime::Backend::kNccl;
    device_ = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(info.local_rank));
  }
  groups_ = runtime::ProcessGroups::create(info, pg);
  is_last_stage_ = groups_->coords().pp == p_ - 1;

  run_dir_ = config::run_directory(r_);
  checkpoint_dir_ = (fs::path(run_dir_) / "checkpoints").string();
  if (groups_->rank() == 0) {
    fs::create_directories(run_dir_);
    std::ofstream(fs::path(run_dir_) / "config.yaml") << config::to_yaml(r_);
  }
  groups_->world().barrier();
  log_ = std::make_unique<MetricsLog>(
      groups_->rank() == 0 ? (fs::path(run_dir_) / "metrics.jsonl").string() : "",
      groups_->rank() == 0);
  log_->message(fmt::format("[loom] {} | t={} p={} v={} d={} | {} micro-batches of {} per step",
                            groups_->layout().describe(), t_, p_, v_, d_, m_, micro_));
}

void TrainingRun::build_data() {
  const int64_t train_samples = r_.trainer.max_steps * global_batch_;
  const int64_t valid_samples = std::max<int64_t>(1, r_.trainer.limit_val_batches) * global_batch_;
  auto cfg = data_config(r_, train_samples, valid_samples,
                         (fs::path(run_dir_) / "index_cache").string());
  // Rank 0 builds the index caches; the others then load them.
  if (groups_->rank() == 0) datasets_ = data::build_gpt_datasets(cfg);
  groups_->world().barrier();
  if (groups_->rank() != 0) datasets_ = data::build_gpt_datasets(cfg);
  if (!datasets_.train) throw std::invalid_argument("model.data.splits_string gives no training data");
  log_->message(fmt::format("[loom] data: {} training samples, {} validation samples of {} tokens",
                            datasets_.train->size(), datasets_.valid ? datasets_.valid->size() : 0,
                            seq_));
}

void TrainingRun::build_model() {
  model_config_ = gpt_config_from_recipe(r_, config::kGpt2VocabSize);
  chunks_ = build_model_chunks(model_config_, *groups_, v_, device_);
  optim::OptimizerOptions oo;
  oo.adamw.beta1 = r_.model.optim.betas[0];
  oo.adamw.beta2 = r_.model.optim.betas[1];
  oo.adamw.eps = r_.model.optim.eps;
  oo.adamw.weight_decay = r_.model.optim.weight_decay;
  oo.distributed = config::uses_distributed_optimizer(r_);
  oo.clip_grad = r_.trainer.gradient_clip_val;
  optimizer_ = optim::Optimizer::create(trainable_params(chunks_), groups_, oo);

  optim::LrScheduleConfig sc;
  sc.lr = r_.model.optim.lr;
  sc.min_lr = r_.model.optim.sched.min_lr;
  sc.warmup_steps = r_.model.optim.sched.warmup_steps;
  sc.constant_steps = r_.model.optim.sched.constant_steps;
  sc.max_steps = r_.model.optim.sched.max_steps > 0 ? r_.model.optim.sched.max_steps
                                                    : r_.trainer.max_steps;
  // A schedule longer than the run (the recipe loader warned) keeps its own horizon: the run
  // simply ends before the decay phase.
  sc.max_steps = std::max(sc.max_steps, sc.warmup_steps + sc.constant_steps);
  switch (r_.model.optim.sched.name) {
    case config::SchedulerName::kCosineAnnealing: sc.decay = optim::LrDecay::kCosine; break;
    case config::SchedulerName::kLinearDecay: sc.decay = optim::LrDecay::kLinear; break;
    case config::SchedulerName::kConstant: sc.decay = optim::LrDecay::kConstant; break;
  }
  scheduler_ = std::make_unique<optim::LrScheduler>(sc);
  if (r_.trainer.precision == config::Precision::kFp16) {
    scaler_ = std::make_unique<optim::LossScaler>();
  }
  int64_t count = 0;
  for (const auto& p : optimizer_->params()) count += p.param.numel();
  log_->message(fmt::format("[loom] model: {} layers, hidden {}, {} parameters on rank 0",
                            model_config_.num_layers, model_config_.hidden_size, count));
}

CheckpointLayout TrainingRun::checkpoint_layout() const {
  CheckpointLayout l;
  l.tensor_parallel = t_;
  l.pipeline_parallel = p_;
  l.virtual_stages = v_;
  l.data_parallel = d_;
  l.model_shape = {{"num_layers", model_config_.num_layers},
                   {"hidden_size", model_config_.hidden_size},
                   {"ffn_hidden_size", model_config_.ffn()},
                   {"num_attention_heads", model_config_.num_attention_heads},
                   {"vocab_size", model_config_.vocab_size},
                   {"max_position_embeddings", model_config_.max_position_embeddings}};
  return l;
}

void TrainingRun::save(int64_t iteration) {
  if (!r_.exp_manager.create_checkpoint_callback) return;  // timing runs (loom plan --measure)
  const auto start = Clock::now();
  RankCheckpoint state;
  const int tp_rank = groups_->coords().tp;
  for (const auto& chunk : chunks_) {
    for (const auto& p : chunk.parameters()) {
      state.model[p.name] = p.tensor.detach();
      std::vector<int64_t> shape = p.tensor.sizes().vec(), offset(shape.size(), 0);
      if (p.tensor_parallel()) {
        offset[p.partition_dim] = shape[p.partition_dim] * tp_rank;
        shape[p.partition_dim] *= t_;
      }
      state.shard_info[p.name] = {{"global_shape", shape}, {"offset", offset}};
    }
  }
  auto opt_state = optimizer_->state_dict();  // collective (distributed optimizer)
  state.optimizer = opt_state.tensors;
  state.values = {{"optimizer", opt_state.values},
                  {"scheduler", scheduler_->state_dict()},
                  {"scaler", scaler_ ? scaler_->state_dict() : nlohmann::json()},
                  {"iteration", iteration},
                  {"consumed_samples", consumed_samples_}};
  save_checkpoint(checkpoint_dir_, iteration, checkpoint_layout(), state, *groups_);
  log_->message(fmt::format("[loom] saved checkpoint {}/{} in {:.1f} s", checkpoint_dir_,
                            iteration_dir_name(iteration), seconds_since(start)));
}

void TrainingRun::maybe_resume() {
  if (!r_.exp_manager.resume_if_exists) return;
  auto iteration = latest_checkpoint(checkpoint_dir_);
  if (!iteration) return;
  RankCheckpoint state = load_checkpoint(checkpoint_dir_, *iteration, checkpoint_layout(), *groups_);
  {
    at::NoGradGuard no_grad;
    for (const auto& chunk : chunks_) {
      for (const auto& p : chunk.parameters()) {
        auto it = state.model.find(p.name);
        if (it == state.model.end()) {
          throw CheckpointError("checkpoint iteration " + std::to_string(*iteration) +
                                " has no parameter " + p.name);
        }
        if (it->second.sizes() != p.tensor.sizes()) {
          throw CheckpointError(fmt::format("checkpoint parameter {} has shape {}, the model {}",
                                            p.name, fmt::join(it->second.sizes(), "x"),
                                            fmt::join(p.tensor.sizes(), "x")));
        }
        p.tensor.copy_(it->second);
      }
    }
  }
  optim::OptimizerState opt;
  opt.tensors = state.optimizer;
  opt.values = state.values.at("optimizer");
  optimizer_->load_state_dict(opt);
  scheduler_->load_state_dict(state.values.at("scheduler"));
  if (scaler_ && !state.values.at("scaler").is_null()) scaler_->load_state_dict(state.values.at("scaler"));
  start_step_ = state.values.at("iteration").get<int64_t>();
  consumed_samples_ = state.values.at("consumed_samples").get<int64_t>();
  log_->message(fmt::format("[loom] resumed from {}/{} (step {}, {} samples consumed)",
                            checkpoint_dir_, iteration_dir_name(*iteration), start_step_,
                            consumed_samples_));
}

std::vector<MicroBatch> TrainingRun::next_micro_batches(data::PretrainingSampler& sampler,
                                                        const data::SampleDataset& dataset) {
  std::vector<MicroBatch> out;
  const int dp_rank = groups_->coords().dp;
  for (int k = 0; k < m_; ++k) {
    auto ids = sampler.next();
    if (!ids) break;
    // Megatron's sampler hands out micro_batch·d consecutive ids per micro-step, rank r taking
    // slice r: this micro-batch's rows in the global batch start at (k·d + r)·micro_batch.
    out.push_back(make_micro_batch(dataset, *ids, (int64_t(k) * d_ + dp_rank) * micro_, device_));
  }
  return out;
}

at::Tensor TrainingRun::forward_step(int chunk, const MicroBatch& mb, const at::Tensor& input,
                                     const model::DropoutContext& ctx, bool validation) {
  const auto& stage = chunks_[chunk];
  model::StageInputs in;
  if (stage.layout().pre_process) {
    in.tokens = mb.tokens;
    in.position_ids = mb.position_ids;
  } else {
    in.hidden = input;
  }
  if (stage.layout().post_process) in.labels = mb.labels;
  at::Tensor out = stage.forward(in, ctx);
  if (!stage.layout().post_process) return out;
  at::Tensor masked = (out.to(at::kFloat) * mb.loss_mask).sum();
  if (validation) return at::stack({masked, mb.loss_mask.sum()});
  // Σ masked losses / (tokens of the whole global batch), times d because the data-parallel
  // gradient reduction averages: gradients do not depend on how the batch is split.
  at::Tensor loss = masked * (double(d_) / global_tokens_);
  if (scaler_) loss = loss * scaler_->scale();
  return loss;
}

double TrainingRun::train_step(int64_t step) {
  data::PretrainingSampler sampler(datasets_.train->size(), consumed_samples_, micro_,
                                   groups_->coords().dp, d_);
  auto batches = next_micro_batches(sampler, *datasets_.train);
  if (int(batches.size()) != m_) throw std::runtime_error("training data exhausted");
  if (is_last_stage_) {
    at::Tensor tokens = at::zeros({1}, at::kDouble);
    for (const auto& mb : batches) tokens += mb.loss_mask.sum().to(at::kDouble).cpu();
    groups_->data().all_reduce(tokens);
    global_tokens_ = std::max(1.0, tokens.item<double>());
  }
  model::DropoutContext ctx;
  ctx.seed = static_cast<uint64_t>(r_.model.seed);
  ctx.step = static_cast<uint64_t>(step);
  ctx.global_batch = global_batch_;
  ctx.training = true;

  ScheduleConfig sc;
  sc.num_microbatches = m_;
  sc.virtual_stages = v_;
  const int64_t s_local = r_.model.sequence_parallel ? seq_ / t_ : seq_;
  sc.activation_shape = {s_local, micro_, r_.model.hidden_size};
  sc.activation_dtype = chunks_.front().parameters().front().tensor.scalar_type();
  sc.after_backward = [&] { optimizer_->accumulate_grads(); };
  const double scale_used = scaler_ ? scaler_->scale() : 1.0;
  optimizer_->zero_grad();
  auto result = run_pipeline_schedule(sc, groups_->pipeline(), [&](int chunk, int k, const at::Tensor& in) {
    model::DropoutContext c = ctx;
    c.batch_offset = batches[k].global_row;
    return forward_step(chunk, batches[k], in, c, false);
  });
  last_step_ = optimizer_->step(scheduler_->lr(), scaler_.get());
  scheduler_->advance();
  consumed_samples_ += global_batch_;

  // Loss of the global batch: Σ over micro-batches and data ranks, brought to every stage.
  at::Tensor loss = at::zeros({1}, at::kDouble);
  if (is_last_stage_) {
    for (const auto& l : result.losses) loss += l.to(at::kDouble).cpu();
    loss /= double(d_) * scale_used;
    groups_->data().all_reduce(loss);
  }
  groups_->pipeline().all_reduce(loss);
  return loss.item<double>();
}

double TrainingRun::validate(int64_t step) {
  if (!datasets_.valid || r_.trainer.limit_val_batches <= 0) return NAN;
  const auto start = Clock::now();
  data::PretrainingSampler sampler(datasets_.valid->size(), 0, micro_, groups_->coords().dp, d_);
  model::DropoutContext ctx;
  ctx.training = false;
  ScheduleConfig sc;
  sc.num_microbatches = m_;
  sc.virtual_stages = v_;
  sc.forward_only = true;
  const int64_t s_local = r_.model.sequence_parallel ? seq_ / t_ : seq_;
  sc.activation_shape = {s_local, micro_, r_.model.hidden_size};
  sc.activation_dtype = chunks_.front().parameters().front().tensor.scalar_type();
  at::Tensor totals = at::zeros({2}, at::kDouble);  // Σ masked loss, Σ tokens
  int64_t batches_done = 0;
  at::NoGradGuard no_grad;
  for (int64_t b = 0; b < r_.trainer.limit_val_batches; ++b) {
    auto batches = next_micro_batches(sampler, *datasets_.valid);
    if (int(batches.size()) != m_) break;
    auto result = run_pipeline_schedule(sc, groups_->pipeline(), [&](int chunk, int k, const at::Tensor& in) {
      return forward_step(chunk, batches[k], in, ctx, true);
    });
    for (const auto& l : result.losses) totals += l.to(at::kDouble).cpu();
    ++batches_done;
  }
  if (is_last_stage_) groups_->data().all_reduce(totals);
  groups_->pipeline().all_reduce(totals);
  const double loss = totals[0].item<double>() / std::max(1.0, totals[1].item<double>());
  log_record({{"kind", "validation"}, {"step", step}, {"max_steps", r_.trainer.max_steps},
              {"val_loss", loss}, {"val_batches", batches_done},
              {"val_time_s", seconds_since(start)}},
             true);
  return loss;
}

void TrainingRun::log_record(nlohmann::json record, bool print) {
  if (groups_->rank() != 0) return;
  log_->write(record, print);
}

bool TrainingRun::stop_requested(int64_t steps_this_process) {
  int local = g_stop_signal.load();
  if (options_.stop_after_steps > 0 && steps_this_process >= options_.stop_after_steps) local = 1;
  at::Tensor flag = at::full({1}, int64_t(local), at::kLong);
  groups_->world().all_reduce(flag, runtime::ReduceOp::kMax);  // every rank stops together
  return flag.item<int64_t>() != 0;
}

int TrainingRun::run() {
  setup();
  build_data();
  build_model();
  maybe_resume();

  struct sigaction sa {};
  sa.sa_handler = loom_on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);

  const int64_t max_steps = r_.trainer.max_steps;
  const int64_t every_save = r_.exp_manager.checkpoint_callback_params.every_n_steps;
  const int64_t every_val = r_.trainer.val_check_interval;
  GptFlopsShape shape{global_batch_, seq_, r_.model.hidden_size, r_.model.num_layers,
                      chunks_.front().padded_vocab_size()};
  const double flops = model_flops_per_iteration(shape);
  const int world = groups_->layout().world_size();
  // MFU needs the accelerator's peak; CPUs have no entry in the table, so no MFU there.
  const auto peak = peak_tflops_for_device(accelerator_name(device_));

  if (start_step_ == 0 && every_val > 0) validate(0);
  const auto run_start = Clock::now();
  int64_t steps_here = 0;
  for (int64_t step = start_step_; step < max_steps; ++step) {
    const auto t0 = Clock::now();
    const double loss = train_step(step);
    const double dt = seconds_since(t0);
    ++steps_here;
    const int64_t done = step + 1;
    nlohmann::json rec = {{"kind", "train"},
                          {"step", done},
                          {"max_steps", max_steps},
                          {"loss", loss},
                          {"lr", scheduler_->lr()},
                          {"grad_norm", last_step_.grad_norm},
                          {"loss_scale", last_step_.loss_scale},
                          {"skipped", last_step_.skipped},
                          {"step_time_s", dt},
                          {"tokens_per_s", double(global_batch_ * seq_) / dt},
                          {"model_tflops_per_device", flops / dt / world / 1e12},
                          {"consumed_samples", consumed_samples_},
                          {"max_rss_mib", max_rss_mib()}};
    if (peak) rec["mfu"] = flops / dt / world / 1e12 / *peak;
    const bool print = done % std::max<int64_t>(1, r_.trainer.log_every_n_steps) == 0 || done == 1;
    log_record(rec, print);
    if (groups_->rank() == 0 && !print) {
      const double eta = seconds_since(run_start) / double(steps_here) * double(max_steps - done);
      log_->progress(fmt::format("step {}/{} | loss {:.4f} | ETA {:.0f}:{:02.0f}", done, max_steps,
                                 loss, std::floor(eta / 60), std::fmod(eta, 60.0)));
    }
    if (!std::isfinite(loss)) {
      throw std::runtime_error(fmt::format("loss became {} at step {}", loss, done));
    }
    if (every_val > 0 && done % every_val == 0 && done != max_steps) validate(done);
    if (done == max_steps) break;
    if (every_save > 0 && done % every_save == 0) save(done);
    if (stop_requested(steps_here)) {
      log_->message(fmt::format("[loom] stop requested at step {}: saving and exiting", done));
      save(done);
      groups_->world().barrier();
      groups_->shutdown();
      return 0;
    }
  }
  if (start_step_ < max_steps) {
    validate(max_steps);
    save(max_steps);
  } else {
    log_->message("[loom] the checkpoint is already at trainer.max_steps: nothing to train");
  }
  groups_->world().barrier();
  groups_->shutdown();
  return 0;
}

}  // namespace

int run_training(const config::Recipe& recipe, const TrainOptions& options) {
  TrainingRun run(recipe, options);
  return run.run();
}

}  // namespace loom::train
