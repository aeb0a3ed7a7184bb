// `loom finetune RECIPE [overrides] [--nproc N] [--stop-after-steps K] [--iteration N]`: LoRA
// fine-tuning of a frozen pretrained GPT (docs/design/lora.md). The recipe is a fine-tuning
// recipe with NeMo 1.x's megatron_gpt_finetuning_config keys (model.restore_from_path,
// model.peft): a NeMo user runs fine-tuning as its own script and config, not as pretraining's.
// Everything that can be checked before a rank starts is: the recipe (each peft field), the
// base checkpoint and tokenizer, the layout with the base's shape. Exit status 2 for bad input,
// 1 for a runtime failure.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <iostream>

#include "command_registry.h"
#include "error_text.h"
#include "local_ranks.h"
#include "training_failure.h"
#include "config/derived.h"
#include "config/recipe.h"
#include "finetune/lora_run.h"
#include "finetune/lora_task.h"
#include "launch/env_rendezvous.h"
#include "train/checkpoint.h"

namespace {

int finetune_command(int argc, char** argv) {
  CLI::App app{"Fine-tune a pretrained GPT with LoRA adapters (the base frozen)."};
  std::string recipe_path;
  std::vector<std::string> overrides;
  int nproc = 0;
  int64_t stop_after = 0, iteration = -1;
  app.add_option("recipe", recipe_path, "fine-tuning recipe, e.g. recipes/lora_tiny_cpu.yaml")->required();
  app.add_option("overrides", overrides, "dotted overrides, e.g. model.peft.lora_tuning.adapter_dim=8");
  app.add_option("--nproc", nproc, "local ranks to start (sets trainer.devices)")->check(CLI::Range(1, 4096));
  app.add_option("--stop-after-steps", stop_after, "save and exit after this many steps, as on SIGTERM")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--iteration", iteration, "resume from this checkpoint iteration instead of the latest")
      ->check(CLI::Range(int64_t{0}, loom::train::kMaxIteration));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (nproc > 0) overrides.push_back("trainer.devices=" + std::to_string(nproc));

  loom::launch::RendezvousInfo info;
  loom::config::Recipe recipe;
  try {
    info = loom::launch::rendezvous_from_env();
    recipe = loom::config::load_recipe(recipe_path, overrides, loom::config::RecipeKind::kFinetuning);
    loom::config::check_input_files(recipe);
  } catch (const loom::config::RecipeError& e) {
    std::cerr << "loom finetune: invalid recipe:\n" << loom::cli::error_text(e) << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "loom finetune: " << loom::cli::error_text(e) << "\n";
    return 2;
  }
  const bool under_launcher = info.source != loom::launch::RendezvousSource::kSingleProcess;
  const int64_t world = loom::config::world_size(recipe);
  const std::optional<int64_t> resume = iteration >= 0 ? std::optional<int64_t>(iteration) : std::nullopt;

  // As loom ptune: one process checks the base and prints the resolved recipe before any rank starts.
  const bool print_recipe =
      !under_launcher || (info.source != loom::launch::RendezvousSource::kLocalLauncher && info.rank == 0);
  if (print_recipe) {
    try {
      const auto plan = loom::finetune::plan_lora_run(recipe, resume);
      for (const auto& w : recipe.origin.warnings) std::cerr << "loom finetune: warning: " << w << "\n";
      std::cerr << "# resolved recipe (the model's shape is the base's)\n" << loom::config::to_yaml(plan.recipe) << std::flush;
    } catch (const std::exception& e) {
      if (!under_launcher) return loom::cli::training_failure("finetune", e);
    }
  }
  if (!under_launcher && world > 1) return loom::cli::run_local_ranks("finetune", argc, argv, world, recipe.trainer.num_nodes);

  loom::train::TrainOptions options;
  options.stop_after_steps = stop_after;
  options.resume_iteration = resume;
  try {
    return loom::finetune::run_lora_finetuning(recipe, options);
  } catch (const std::exception& e) {
    return loom::cli::training_failure("finetune", e);
  }
}

}  // namespace

LOOM_REGISTER_COMMAND("finetune", "LoRA fine-tuning of a frozen pretrained GPT (loom finetune RECIPE [overrides])",
                      finetune_command);
