#include "convert/lora_merge.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <filesystem>

#include "config/recipe.h"
#include "convert/checkpoint_writer.h"
#include "convert/convert_error.h"
#include "convert/lora_checkpoint.h"
#include "convert/run_recipe.h"
#include "finetune/lora_run.h"
#include "generate/checkpoint_reader.h"
#include "model/lora.h"
#include "ptune/frozen_base.h"
#include "train/checkpoint_files.h"
#include "train/model_setup.h"

namespace fs = std::filesystem;

namespace loom::convert {

namespace {

// The base run's recipe with its tokenizer files as absolute paths (the merged run lives elsewhere).
config::Recipe merged_recipe(const std::string& base_run) {
  config::Recipe recipe = load_run_recipe(base_run, "the merged run's config.yaml");
  auto& k = recipe.model.tokenizer;
  auto absolute = [&](const std::string& path, const char* field) {
    return fs::absolute(resolve_run_file(path, base_run, field)).string();
  };
  if (k.library == config::TokenizerLibrary::kMegatron) {
    k.vocab_file = absolute(k.vocab_file, "model.tokenizer.vocab_file");
    k.merge_file = absolute(k.merge_file, "model.tokenizer.merge_file");
  } else if (k.model) {
    k.model = absolute(*k.model, "model.tokenizer.model");
  }
  return recipe;
}

}  // namespace

LoraMergeResult merge_lora(const LoraMergeRequest& request) {
  const std::string what = "--checkpoint " + request.adapter_checkpoint;
  AdapterCheckpoint checkpoint = read_adapter_checkpoint(request.adapter_checkpoint, request.iteration);
  const generate::CheckpointInfo& info = checkpoint.info;
  const finetune::LoraRecord& record = checkpoint.record;
  const generate::FullCheckpoint& adapters = checkpoint.adapters;
  generate::FullCheckpoint& base = checkpoint.base;
  const generate::CheckpointInfo& base_info = base.info;
  if (checkpoint.base_location.run_dir.empty())
    throw ConvertInputError(fmt::format("{}: the base {} has no run directory with config.yaml above it (the merged "
                                        "run's recipe starts from it)",
                                        what, record.base_checkpoints));
  config::Recipe recipe = merged_recipe(checkpoint.base_location.run_dir);
  // The merged run is its own run: `loom train` on its config.yaml continues it, not the base.
  const std::string run_dir = fs::absolute(request.output_run).lexically_normal().string();
  recipe.exp_manager.explicit_log_dir = run_dir;
  recipe.run.results_dir = run_dir;
  recipe.run.name = fs::path(run_dir).filename().string();

  const fs::path run(request.output_run);
  const std::string checkpoints = (run / "checkpoints").string();
  if (!train::list_iterations(checkpoints).empty() || fs::exists(fs::path(checkpoints) / train::kTrackerFile))
    throw ConvertInputError(checkpoints + " holds checkpoints already: merge into a new run directory");

  LoraMergeResult result;
  result.iteration = info.iteration;
  result.base_checkpoints = record.base_checkpoints;
  result.base_iteration = record.base_iteration;
  const std::string a_suffix = ".lora_a.weight";
  for (const auto& [name, a] : adapters.params) {
    if (name.size() < a_suffix.size() || name.compare(name.size() - a_suffix.size(), a_suffix.size(), a_suffix) != 0)
      continue;
    const std::string linear = name.substr(0, name.size() - a_suffix.size());
    auto b = adapters.params.find(model::lora_b_name(linear));
    auto w = base.params.find(linear + ".weight");
    if (b == adapters.params.end() || w == base.params.end())
      throw ConvertInputError(fmt::format("{}: adapter {} has no {} in the adapters or no {}.weight in the base", what,
                                          name, model::lora_b_name(linear), linear));
    w->second = model::merge_lora_weight(w->second, a, b->second, record.lora.scale());
    ++result.merged_weights;
  }
  if (result.merged_weights == 0) throw ConvertInputError(what + ": the checkpoint holds no LoRA adapters");

  const model::GptConfig config = train::gpt_config_from_recipe(recipe, base_info.layout.model_shape.vocab_size);
  fs::create_directories(run);
  CheckpointWriter writer(checkpoints, 0, base_info.layout);
  write_fresh_ranks(writer, base_info.layout.parallel, config, base.params);
  writer.commit();
  train::write_text_atomically((run / "config.yaml").string(), config::to_yaml(recipe));
  return result;
}

}  // namespace loom::convert
