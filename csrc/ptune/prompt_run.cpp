#include "ptune/prompt_run.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <numeric>

#include "config/derived.h"
#include "data/data_error.h"
#include "data/pretraining_sampler.h"
#include "data/recipe_tokenizer.h"
#include "generate/checkpoint_reader.h"
#include "launch/env_rendezvous.h"
#include "launch/local_launcher.h"
#include "prompt_data/epoch_order.h"
#include "prompt_data/prompt_batch.h"
#include "ptune/answer_metrics.h"
#include "ptune/prompt_model.h"
#include "runtime/cpu_threads.h"
#include "runtime/error_text.h"
#include "runtime/process_groups.h"
#include "runtime/run_device.h"
#include "planner/hardware.h"
#include "train/device_info.h"
#include "train/gpt_step.h"
#include "train/metrics_log.h"
#include "train/micro_batches.h"
#include "train/model_setup.h"
#include "train/optim/lr_schedule.h"
#include "train/optim/optimizer.h"
#include "train/run_directory.h"
#include "train/run_settings.h"
#include "train/step_log.h"
#include "train/step_loop.h"
#include "train/stop_signal.h"
#include "train/training_state.h"

namespace fs = std::filesystem;

namespace loom::ptune {

namespace {

const char* style_name(config::VirtualPromptStyle style) {
  return style == config::VirtualPromptStyle::kPTuning ? "p-tuning" : "prompt-tuning";
}

bool listed(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// `field` (e.g. "model.data.train_ds") prefixes any error, which names the file and line.
std::shared_ptr<prompt_data::PromptDataset> read_dataset(const char* field, const std::vector<std::string>& files,
                                                         const PromptRunPlan& plan,
                                                         const prompt_data::ExampleOptions& options) {
  if (files.empty()) return nullptr;
  std::shared_ptr<prompt_data::PromptDataset> dataset;
  try {
    dataset = std::make_shared<prompt_data::PromptDataset>(files, plan.templates, *plan.tokenizer, options);
  } catch (const data::DataError& e) {
    throw data::DataError(std::string(field) + ": " + e.what());
  }
  // A file listed but empty is a mistake (a wrong path, an export that failed), not an empty task.
  for (size_t f = 0; f < files.size(); ++f) {
    if (dataset->records_per_file()[f] > 0) continue;
    const int64_t lines = dataset->lines_per_file()[f];
    throw data::DataError(fmt::format("{}: {} holds no records ({}); expected one JSON object per line", field, files[f],
                                      lines == 0 ? "the file is empty" : fmt::format("only {} blank line(s)", lines)));
  }
  return dataset;
}

}  // namespace

namespace {

// The run's sequence length cap: model.data.max_seq_length, at most the base's positions.
int64_t max_sequence_length(const config::Recipe& r, const FrozenBase& base) {
  const int64_t base_positions = generate::inference_config(base.plan.info.layout.model_shape).max_position_embeddings;
  const int64_t max_seq = r.model.data.max_seq_length.value_or(base_positions);
  if (max_seq > base_positions)
    throw std::invalid_argument(fmt::format("model.data.max_seq_length: expected at most the base's "
                                            "max_position_embeddings {}, found {}", base_positions, max_seq));
  return max_seq;
}

// The train/validation/test datasets laid out with the run's tokenizer.
void read_datasets(PromptRunPlan& plan, int64_t max_seq) {
  const auto& r = plan.recipe;
  prompt_data::ExampleOptions options = prompt_data::example_options(*plan.tokenizer);
  options.add_bos = r.model.data.add_bos;
  options.add_eos = r.model.data.add_eos;
  options.max_seq_length = max_seq;
  plan.train = read_dataset("model.data.train_ds", r.model.data.train_ds, plan, options);
  plan.valid = read_dataset("model.data.validation_ds", r.model.data.validation_ds, plan, options);
  plan.test = read_dataset("model.data.test_ds", r.model.data.test_ds, plan, options);
  if (!plan.train || plan.train->size() == 0)
    throw data::DataError("model.data.train_ds: no training examples (" +
                          (plan.train ? plan.train->summary() : std::string("no files")) + ")");
}

// Every task with records must have virtual tokens to splice (trained now or kept), and every
// new task records to train on.
void check_tasks_have_prompts(const PromptRunPlan& plan) {
  const auto& prompt = plan.recipe.model.prompt;
  for (const auto* ds : {plan.train.get(), plan.valid.get(), plan.test.get()}) {
    if (!ds) continue;
    const auto counts = ds->examples_per_task();
    for (size_t t = 0; t < counts.size(); ++t) {
      const auto& name = plan.templates[t].spec.taskname;
      if (counts[t] > 0 && !listed(prompt.new_tasks, name) && !listed(prompt.existing_tasks, name))
        throw std::invalid_argument(fmt::format("model.new_tasks: task '{}' has {} records but is neither in "
                                                "model.new_tasks nor in model.existing_tasks", name, counts[t]));
    }
  }
  for (size_t t = 0; t < plan.templates.size(); ++t) {
    const auto& name = plan.templates[t].spec.taskname;
    if (listed(prompt.new_tasks, name) && plan.train->examples_per_task()[t] == 0)
      throw std::invalid_argument(fmt::format("model.new_tasks: task '{}' has no records in model.data.train_ds: "
                                              "there is nothing to train it on", name));
  }
}

// model.restore_path's tables, holding every existing task.
void read_restored_tables(PromptRunPlan& plan) {
  const auto& prompt = plan.recipe.model.prompt;
  if (!prompt.restore_path) return;
  try {
    plan.restored = read_prompt_tables(*prompt.restore_path);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("model.restore_path: ") + e.what());
  }
  for (const auto& name : prompt.existing_tasks)
    if (!plan.restored->find(name))
      throw std::invalid_argument(fmt::format("model.existing_tasks: task '{}' is not in the tables of "
                                              "model.restore_path {} (they hold {})",
                                              name, *prompt.restore_path, plan.restored->task_list()));
}

// What the ranks would otherwise find only once started: a tpmlp hidden size t does not divide,
// a restored table of the wrong shape.
void check_prompt_shapes(const PromptRunPlan& plan) {
  const auto& r = plan.recipe;
  const auto& prompt = r.model.prompt;
  const int64_t t = r.model.tensor_model_parallel_size;
  const int64_t h = r.model.hidden_size;
  const auto& pt = prompt.p_tuning;
  const int64_t encoder_hidden = pt.encoder_hidden.value_or(std::max<int64_t>(1, h / 2));
  if (prompt.virtual_prompt_style == config::VirtualPromptStyle::kPTuning &&
      pt.encoder_type == config::PromptEncoderType::kTpMlp && encoder_hidden % t != 0)
    throw std::invalid_argument(fmt::format("model.p_tuning.encoder_hidden: a tpmlp encoder splits it over "
                                            "tensor_model_parallel_size {}; {} is not divisible by it",
                                            t, encoder_hidden));
  for (const auto& name : prompt.existing_tasks) {
    const PromptTable* table = plan.restored->find(name);
    const auto& spec = plan.templates[static_cast<size_t>(prompt_data::find_task(plan.templates, name))].spec;
    if (table->vectors.size(0) != spec.total_virtual_tokens || table->vectors.size(1) != h)
      throw std::invalid_argument(fmt::format("model.existing_tasks: task '{}' has a [{}, {}] table in "
                                              "model.restore_path, this run needs [{}, {}]",
                                              name, table->vectors.size(0), table->vectors.size(1),
                                              spec.total_virtual_tokens, h));
  }
}

}  // namespace

PromptRunPlan plan_prompt_run(const config::Recipe& recipe, std::optional<int64_t> resume_iteration) {
  PromptRunPlan plan;
  plan.recipe = recipe;
  auto& r = plan.recipe;
  plan.base = find_frozen_base(r, resume_iteration);
  const int64_t max_seq = max_sequence_length(r, plan.base);
  plan.tokenizer = load_run_tokenizer(r, plan.base);
  plan.templates = prompt_data::parse_task_templates(r.model.prompt.task_templates, max_seq);
  read_datasets(plan, max_seq);
  check_tasks_have_prompts(plan);
  read_restored_tables(plan);

  const int64_t t = r.model.tensor_model_parallel_size;
  const bool sp = r.model.sequence_parallel;  // normalised by the recipe loader (off at t = 1)
  std::vector<const prompt_data::PromptDataset*> all{plan.train.get()};
  if (plan.valid) all.push_back(plan.valid.get());
  if (plan.test) all.push_back(plan.test.get());
  plan.seq_length = prompt_data::run_sequence_length(all, sp ? std::lcm<int64_t>(8, t) : 8, sp ? t : 1);
  adopt_base_shape(r, plan.base, plan.seq_length);
  config::validate_adopted_shape(r);
  check_prompt_shapes(plan);
  return plan;
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A micro-batch of prompt rows as the training step takes it, plus the answer mask for the
// exact-match check.
struct PromptMicroBatch {
  train::MicroBatch mb;
  at::Tensor answer_mask;  ///< [b, s] float32
};

// Everything one rank holds for the run; run() reads top-down like train::TrainingRun.
class PromptRun {
 public:
  PromptRun(const config::Recipe& recipe, const PromptRunOptions& options) : options_(options), plan_(plan_prompt_run(recipe, options.resume_iteration)), r_(plan_.recipe) {}

  int run();
  /// After run() threw: this rank's step records not yet flushed (no collective).
  void keep_unflushed_steps() noexcept {
    if (step_log_) step_log_->keep_unflushed_steps();
  }

 private:
  void setup();
  void build_model();
  void resume();
  void train_step(int64_t step);
  std::optional<double> validate(int64_t step);
  void test();
  at::Tensor evaluate(const prompt_data::PromptDataset& dataset, int64_t max_global_batches, int64_t& batches_done);
  void save(int64_t iteration);
  void write_tables(const std::string& dir, int64_t iteration, double val_loss);
  int finish();
  PromptMicroBatch micro_batch(const prompt_data::PromptDataset& dataset, const std::vector<int64_t>& ids,
                               int64_t row, bool training, uint64_t step);
  train::CheckpointLayout layout() const;
  train::TrainingParts parts() {
    return {&chunks_, optimizer_.get(), scheduler_.get(), scaler_.get(), &prompt_params_};
  }
  bool is_rank0() const { return groups_->rank() == 0; }
  bool first_stage() const { return groups_->coords().pp == 0; }

  PromptRunOptions options_;
  PromptRunPlan plan_;
  config::Recipe& r_;
  Layout shape_;
  std::shared_ptr<runtime::ProcessGroups> groups_;
  std::unique_ptr<train::RunDirectory> dir_;
  std::unique_ptr<train::MetricsLog> log_;
  model::GptConfig model_config_;
  std::vector<model::GptStage> chunks_;
  std::unique_ptr<PromptModel> prompt_;  // first pipeline stage only
  model::ParamList prompt_params_;
  std::unique_ptr<train::optim::Optimizer> optimizer_;
  std::unique_ptr<train::optim::LrScheduler> scheduler_;
  std::unique_ptr<train::optim::LossScaler> scaler_;
  std::unique_ptr<train::GptStep> step_;
  std::unique_ptr<train::StepLog> step_log_;
  std::unique_ptr<prompt_data::EpochOrder> order_;
  train::TrainingPosition position_;
  int64_t first_step_ = 0;              ///< the first step this process trains (after resume)
  std::string base_digest_;             ///< this rank's slice of the base, checked at the end
  std::string base_checkpoint_digest_;  ///< the whole base checkpoint (the same for every layout)
  double best_val_loss_ = std::numeric_limits<double>::infinity();
};

int PromptRun::run() {
  setup();
  build_model();
  resume();
  first_step_ = position_.iteration;
  dir_->write_resolved_recipe(r_);
  train::install_stop_signal_handlers();

  const train::StepLoopHooks hooks{[&](int64_t step) { train_step(step); }, [&](int64_t done) { validate(done); },
                                   [&](int64_t done) { save(done); }};
  if (train::run_step_loop(r_, position_.iteration, options_.stop_after_steps, *groups_, *log_, hooks) !=
      train::StepLoopEnd::kMaxSteps)
    return finish();
  const int64_t max_steps = r_.trainer.max_steps;
  const auto val_loss = validate(max_steps);
  save(max_steps);
  write_tables(prompt_tables_dir(dir_->run_dir()), max_steps, val_loss.value_or(-1));
  test();
  return finish();
}

void PromptRun::setup() {
  const auto info = launch::rendezvous_from_env();
  const int64_t world = config::world_size(r_);
  if (info.world_size != world)
    throw std::invalid_argument(fmt::format(
        "the recipe asks for trainer.num_nodes × trainer.devices = {} ranks, but {} were started", world,
        info.world_size));
  shape_ = config::recipe_layout(r_);
  runtime::use_fair_share_of_cores(info.local_world_size);
  // Before anything in the run directory is touched: one run per directory.
  dir_ = std::make_unique<train::RunDirectory>(
      train::run_directory_options(r_, "loom ptune", options_.resume_iteration), info.rank == 0);

  const runtime::ProcessGroupOptions pg = train::process_group_options(r_, info.local_rank);
  groups_ = runtime::ProcessGroups::create(info, pg);
  groups_->host_world().barrier();
  log_ = std::make_unique<train::MetricsLog>(is_rank0() ? (fs::path(dir_->run_dir()) / "metrics.jsonl").string() : "",
                                             is_rank0());
  dir_->attach(*groups_, *log_);
  log_->message(fmt::format("[loom] prompt learning ({}) on {} | t={} p={} v={} d={} | {} micro-batches of {} per step",
                            style_name(r_.model.prompt.virtual_prompt_style), groups_->layout().describe(),
                            shape_.tp, shape_.pp, shape_.vp, shape_.dp, shape_.micro_batches(), shape_.micro_batch));
  log_->message("[loom] device: " + pg.device.describe());
  log_->message("[loom] data: train " + plan_.train->summary() +
                (plan_.valid ? "; validation " + plan_.valid->summary() : std::string()) +
                fmt::format("; sequence length {}", plan_.seq_length));
  order_ = std::make_unique<prompt_data::EpochOrder>(plan_.train->size(), static_cast<uint64_t>(r_.model.seed),
                                                     /*shuffle=*/true);
}

void PromptRun::build_model() {
  model_config_ = train::gpt_config_from_recipe(r_, static_cast<int64_t>(plan_.tokenizer->vocab_size()));
  const generate::FullCheckpoint full =
      generate::read_full_checkpoint(plan_.base.plan.location.checkpoints, plan_.base.plan.info);
  chunks_ = build_frozen_chunks(full, model_config_, *groups_, shape_.vp);
  base_digest_ = parameters_digest(chunks_);
  base_checkpoint_digest_ = checkpoint_digest(full);
  if (plan_.restored && plan_.restored->base.contains("checkpoint_digest") &&
      plan_.restored->base["checkpoint_digest"] != base_checkpoint_digest_)
    throw std::invalid_argument(fmt::format("model.restore_path: its tables were tuned on another base (checkpoint "
                                            "digest {}), model.language_model_path is {}",
                                            plan_.restored->base["checkpoint_digest"].get<std::string>(),
                                            base_checkpoint_digest_));
  if (first_stage()) {
    auto emb = full.params.find("embedding.word_embeddings.weight");
    if (emb == full.params.end())
      throw train::CheckpointError("model.language_model_path: the base checkpoint has no embedding.word_embeddings.weight");
    prompt_ = std::make_unique<PromptModel>(r_, plan_.templates, emb->second, *plan_.tokenizer,
                                            plan_.restored ? &*plan_.restored : nullptr, groups_->tensor_ptr(),
                                            groups_->device());
    prompt_params_ = prompt_->parameters();
  }
  optimizer_ = train::optim::Optimizer::create(prompt_params_, groups_, train::optimizer_options(r_));
  scheduler_ = std::make_unique<train::optim::LrScheduler>(train::lr_schedule_config(r_));
  if (r_.trainer.precision == config::Precision::kFp16) scaler_ = std::make_unique<train::optim::LossScaler>(train::optim::LossScalerConfig{}, groups_->device());
  step_ = std::make_unique<train::GptStep>(chunks_, *groups_, shape_);

  train::StepLogConfig lc;
  lc.max_steps = r_.trainer.max_steps;
  lc.print_every = r_.trainer.log_every_n_steps;
  lc.tokens_per_step = shape_.global_batch * r_.model.data.seq_length;
  // The frozen base runs forward and the input-gradient half of backward (its weights take no
  // gradients): 2/3 of a training iteration's model FLOPs (docs/design/ptuning.md, "The model").
  lc.model_flops_per_step = train::model_flops_per_step(model_config_, shape_) * 2 / 3;
  lc.peak_tflops = planner::peak_tflops_for_device(train::accelerator_name(groups_->device()));
  lc.world_size = groups_->layout().world_size();
  if (r_.trainer.max_time)
    if (const auto seconds = config::parse_max_time(*r_.trainer.max_time)) lc.max_time_s = double(*seconds);
  step_log_ = std::make_unique<train::StepLog>(lc, *groups_, is_rank0() ? log_.get() : nullptr);
  if (prompt_)
    log_->message(fmt::format("[loom] base: {} (iteration {}{}, {} layers, hidden {}, checkpoint digest {}), frozen; "
                              "{} trainable prompt parameters",
                              plan_.base.path, plan_.base.plan.info.iteration,
                              plan_.base.pinned.empty() ? "" : ", " + plan_.base.pinned, model_config_.num_layers,
                              model_config_.hidden_size, base_checkpoint_digest_, prompt_->num_parameters()));
  log_->message("[loom] base parameters of this rank: digest " + base_digest_);
}

train::CheckpointLayout PromptRun::layout() const {
  train::CheckpointLayout l = train::checkpoint_layout(shape_, model_config_);
  // A prompt checkpoint names its base and what it trains; a resume must match.
  const auto& p = r_.model.prompt;
  l.model_shape["prompt_learning"] = {{"base_checkpoints", fs::weakly_canonical(plan_.base.plan.location.checkpoints).string()},
                                      {"base_iteration", plan_.base.plan.info.iteration},
                                      {"virtual_prompt_style", style_name(p.virtual_prompt_style)},
                                      {"new_tasks", p.new_tasks}};
  return l;
}

void PromptRun::resume() {
  const auto point = dir_->resume(layout());
  if (!point) return;
  position_ = train::restore_training_state(point->state, parts());
  // The best validation loss so far is the one the best tables were written at.
  try {
    const auto best = read_prompt_tables((fs::path(dir_->run_dir()) / "prompt_tables_best").string());
    if (best.val_loss >= 0) best_val_loss_ = best.val_loss;
  } catch (const std::invalid_argument&) {
    // none written yet
  }
  log_->message(fmt::format("[loom] resumed from {} (step {}, {} samples consumed)", dir_->iteration_path(point->iteration),
                            position_.iteration, position_.consumed_samples));
}

PromptMicroBatch PromptRun::micro_batch(const prompt_data::PromptDataset& dataset, const std::vector<int64_t>& ids,
                                        int64_t row, bool training, uint64_t step) {
  const prompt_data::PromptBatch b = prompt_data::make_prompt_batch(dataset, ids, plan_.seq_length);
  const at::Device device = groups_->device();
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

void PromptRun::train_step(int64_t step) {
  step_log_->begin_step();
  const auto start = Clock::now();
  const int64_t stream = r_.trainer.max_steps * shape_.global_batch;
  data::PretrainingSampler sampler(stream, position_.consumed_samples, shape_.micro_batch, groups_->coords().dp, shape_.dp);
  std::vector<train::MicroBatch> batches;
  for (int k = 0; k < shape_.micro_batches(); ++k) {
    auto ids = sampler.next();
    if (!ids) throw std::logic_error("prompt learning: the sample stream ended before trainer.max_steps");
    for (auto& i : *ids) i = (*order_)[i];  // stream index -> example
    const int64_t row = train::micro_batch_global_row(int64_t(k), shape_.dp, groups_->coords().dp, shape_.micro_batch);
    batches.push_back(micro_batch(*plan_.train, *ids, row, true, static_cast<uint64_t>(step)).mb);
  }
  model::DropoutContext dropout;  // the base has no dropout; kept for the step's interface
  dropout.seed = static_cast<uint64_t>(r_.model.seed);
  dropout.step = static_cast<uint64_t>(step);
  dropout.global_batch = shape_.global_batch;
  optimizer_->start_iteration(shape_.micro_batches());  // arms model.optim.overlap_grad_sync
  at::Tensor loss = step_->train(batches, dropout, scaler_ ? scaler_->scale_tensor() : at::Tensor(), [&] { optimizer_->accumulate_grads(); });
  const train::optim::StepResult result = optimizer_->step(scheduler_->lr(), scaler_.get());
  if (step == first_step_) train::report_gradient_overlap(*optimizer_, *log_, step);
  scheduler_->advance();
  position_.iteration = step + 1;
  position_.consumed_samples += shape_.global_batch;
  step_log_->add(step + 1, loss, result, scheduler_->lr(), seconds_since(start), position_.consumed_samples);
}

at::Tensor PromptRun::evaluate(const prompt_data::PromptDataset& dataset, int64_t max_global_batches,
                               int64_t& batches_done) {
  at::NoGradGuard no_grad;
  const bool last_stage = groups_->coords().pp == shape_.pp - 1;
  train::ScheduleConfig sc = train::gpt_schedule(model_config_, shape_, groups_->device(), /*forward_only=*/true);
  at::Tensor totals = at::zeros({4}, at::TensorOptions().dtype(at::kDouble).device(groups_->device()));
  data::PretrainingSampler sampler(dataset.size(), 0, shape_.micro_batch, groups_->coords().dp, shape_.dp);
  model::DropoutContext off;
  off.training = false;
  batches_done = 0;
  const int64_t whole = dataset.size() / shape_.global_batch;
  const int64_t limit = max_global_batches > 0 ? std::min(whole, max_global_batches) : whole;
  if (limit == whole && dataset.size() % shape_.global_batch != 0)
    log_->message(fmt::format("[loom] warning: {} of the {} records are not scored (whole global batches of {} only)",
                              dataset.size() % shape_.global_batch, dataset.size(), shape_.global_batch));
  for (int64_t g = 0; g < limit; ++g) {
    std::vector<PromptMicroBatch> batches;
    for (int k = 0; k < shape_.micro_batches(); ++k) {
      auto ids = sampler.next();
      const int64_t row = train::micro_batch_global_row(int64_t(k), shape_.dp, groups_->coords().dp, shape_.micro_batch);
      batches.push_back(micro_batch(dataset, *ids, row, false, 0));
    }
    auto result = train::run_pipeline_schedule(sc, groups_->pipeline_links(), [&](int chunk, int k, const at::Tensor& in) {
      const auto& stage = chunks_[chunk];
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
      return answer_totals(out, b.mb.labels, b.mb.loss_mask, b.answer_mask, groups_->tensor_ptr(),
                           model_config_.vocab_size);
    });
    if (last_stage)
      for (const auto& t : result.losses) totals += t;
    ++batches_done;
  }
  return step_->reduce_totals(totals);
}

std::optional<double> PromptRun::validate(int64_t step) {
  if (!plan_.valid) return std::nullopt;
  optimizer_->wait_for_params();  // model.optim.overlap_param_sync leaves the last gather open
  step_log_->flush();
  const auto start = Clock::now();
  int64_t batches = 0;
  const at::Tensor sums = evaluate(*plan_.valid, r_.trainer.limit_val_batches, batches).to(at::kCPU);
  if (batches == 0) return std::nullopt;
  const double loss = sums[0].item<double>() / std::max(1.0, sums[1].item<double>());
  const double examples = sums[3].item<double>();
  const double accuracy = examples > 0 ? sums[2].item<double>() / examples : 0.0;
  if (is_rank0())
    log_->write({{"kind", "validation"}, {"step", step}, {"max_steps", r_.trainer.max_steps}, {"val_loss", loss},
                 {"val_accuracy", accuracy}, {"val_examples", static_cast<int64_t>(examples)},
                 {"val_batches", batches}, {"val_time_s", seconds_since(start)}},
                true);
  // World rank 0 (the one that writes the tables) decides, so that every rank joins the tables'
  // collective gather or none does. host: one flag on the host group.
  at::Tensor better = at::zeros({1}, at::kLong);
  if (is_rank0() && step > 0 && loss < best_val_loss_) better[0] = 1;
  groups_->host_world().all_reduce(better);
  if (better.item<int64_t>() > 0) {
    best_val_loss_ = loss;
    write_tables((fs::path(dir_->run_dir()) / "prompt_tables_best").string(), step, loss);
  }
  return loss;
}

void PromptRun::test() {
  if (!plan_.test) return;
  int64_t batches = 0;
  const at::Tensor sums = evaluate(*plan_.test, 0, batches).to(at::kCPU);
  if (batches == 0) {
    log_->message(fmt::format("[loom] test: fewer than one global batch ({}) of examples: not evaluated",
                              shape_.global_batch));
    return;
  }
  const double examples = sums[3].item<double>();
  if (is_rank0())
    log_->write({{"kind", "test"}, {"step", position_.iteration},
                 {"test_loss", sums[0].item<double>() / std::max(1.0, sums[1].item<double>())},
                 {"test_accuracy", examples > 0 ? sums[2].item<double>() / examples : 0.0},
                 {"test_examples", static_cast<int64_t>(examples)}},
                true);
}

void PromptRun::write_tables(const std::string& dir, int64_t iteration, double val_loss) {
  if (!prompt_) return;  // the tables live on the first pipeline stage
  PromptTables tables;
  tables.tasks = prompt_->tables();  // collective over the first stage's tensor group (tpmlp)
  if (!is_rank0()) return;
  tables.style = style_name(r_.model.prompt.virtual_prompt_style);
  tables.base = {{"path", plan_.base.path},
                 {"checkpoints", fs::weakly_canonical(plan_.base.plan.location.checkpoints).string()},
                 {"iteration", plan_.base.plan.info.iteration},
                 {"model_shape", plan_.base.plan.info.layout.model_shape},
                 {"checkpoint_digest", base_checkpoint_digest_},
                 // The tokenizer the records were laid out with (generate uses it by default).
                 {"tokenizer", tokenizer_record(data::tokenizer_spec(r_.model.tokenizer))}};
  tables.iteration = iteration;
  tables.val_loss = val_loss;
  tables.add_bos = r_.model.data.add_bos;
  tables.add_eos = r_.model.data.add_eos;
  write_prompt_tables(dir, tables);
  log_->message(fmt::format("[loom] wrote the inference tables of {} to {}", tables.task_list(), dir));
}

void PromptRun::save(int64_t iteration) {
  step_log_->flush();
  optimizer_->wait_for_params();
  dir_->save(iteration, layout(), [&] {
    return train::capture_training_state(parts(), position_, groups_->coords().tp, shape_.tp);
  });
}

int PromptRun::finish() {
  step_log_->flush();
  log_->print_summary();
  const std::string after = parameters_digest(chunks_);
  if (after != base_digest_)
    throw std::logic_error("the frozen base changed during prompt learning (digest " + base_digest_ + " -> " + after + ")");
  if (prompt_) log_->message("[loom] base parameters unchanged (digest " + after + ")");
  groups_->host_world().barrier();
  groups_->shutdown();
  return 0;
}

}  // namespace

int run_prompt_learning(const config::Recipe& recipe, const PromptRunOptions& options) {
  std::unique_ptr<PromptRun> run;
  try {
    run = std::make_unique<PromptRun>(recipe, options);
    return run->run();
  } catch (const std::exception& e) {
    // Recorded while the groups are open (the launcher must see this error first); then this
    // rank's step records not yet flushed, so that a failed run keeps its losses.
    launch::record_rank_error(runtime::error_text(e));
    if (run) run->keep_unflushed_steps();
    throw;
  }
}

}  // namespace loom::ptune
