#include "ptune/prompt_run.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "config/derived.h"
#include "data/data_error.h"
#include "data/recipe_tokenizer.h"
#include "generate/checkpoint_reader.h"

namespace loom::ptune {

namespace {

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

// The run's sequence length cap: model.data.max_seq_length, at most the base's positions.
int64_t max_sequence_length(const config::Recipe& r, const FrozenBase& base) {
  const int64_t base_positions = base.plan.info.layout.model_shape.max_position_embeddings;
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

}  // namespace loom::ptune
