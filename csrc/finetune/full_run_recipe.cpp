#include "finetune/full_run_recipe.h"

#include <filesystem>

#include "config/derived.h"

namespace fs = std::filesystem;

namespace loom::finetune {

std::optional<config::Recipe> full_run_recipe(const FinetuneRunPlan& plan) {
  const std::string& base_run = plan.base.plan.location.run_dir;
  const fs::path file = base_run.empty() ? fs::path() : fs::path(base_run) / "config.yaml";
  if (file.empty() || !fs::is_regular_file(file)) return std::nullopt;
  config::Recipe out;
  try {
    out = config::load_recipe(file.string());
  } catch (const std::exception& e) {
    throw std::invalid_argument("model.restore_from_path: cannot read the base run's recipe " + file.string() + ":\n" +
                                e.what());
  }
  const config::Recipe& sft = plan.recipe;
  // The base's tokenizer as the plan found it (generate's rules), by absolute paths.
  const data::TokenizerSpec& k = plan.base.plan.tokenizer;
  auto absolute = [](const std::string& path) { return path.empty() ? path : fs::absolute(path).lexically_normal().string(); };
  if (out.model.tokenizer.library == config::TokenizerLibrary::kMegatron) {
    out.model.tokenizer.vocab_file = absolute(k.vocab_file);
    out.model.tokenizer.merge_file = absolute(k.merge_file);
  } else if (!k.model.empty()) {
    out.model.tokenizer.model = absolute(k.model);
  }
  const std::string run_dir = fs::absolute(config::run_directory(sft)).lexically_normal().string();
  out.run.name = sft.run.name;
  out.run.results_dir = run_dir;
  out.exp_manager = sft.exp_manager;
  out.exp_manager.explicit_log_dir = run_dir;
  out.trainer = sft.trainer;
  const auto& m = sft.model;
  out.model.micro_batch_size = m.micro_batch_size;
  out.model.global_batch_size = m.global_batch_size;
  out.model.tensor_model_parallel_size = m.tensor_model_parallel_size;
  out.model.pipeline_model_parallel_size = m.pipeline_model_parallel_size;
  out.model.virtual_pipeline_model_parallel_size = m.virtual_pipeline_model_parallel_size;
  out.model.num_layers_in_first_pipeline_stage = m.num_layers_in_first_pipeline_stage;
  out.model.num_layers_in_last_pipeline_stage = m.num_layers_in_last_pipeline_stage;
  out.model.sequence_parallel = m.sequence_parallel;
  out.model.optim = m.optim;
  return out;
}

}  // namespace loom::finetune
