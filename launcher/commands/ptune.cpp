// `loom ptune RECIPE [overrides] [--nproc N] [--stop-after-steps K] [--iteration N]`: p-tuning or
// prompt tuning of a frozen GPT (docs/design/ptuning.md). The recipe is a prompt-learning
// recipe (NeMo's megatron_gpt_prompt_learning_config keys). Everything that can be checked
// before a rank starts is: the recipe, the base checkpoint, every template rule, every record
// of the datasets (file:line), the sequence length and the layout with the base's shape. Exit
// status 2 for bad input, 1 for a runtime failure.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <iostream>

#include "command_registry.h"
#include "error_text.h"
#include "local_ranks.h"
#include "training_failure.h"
#include "config/derived.h"
#include "config/recipe.h"
#include "data/data_error.h"
#include "launch/env_rendezvous.h"
#include "launch/run_lock.h"
#include "ptune/prompt_run.h"
#include "ptune/prompt_task.h"
#include "train/checkpoint.h"

namespace {

int ptune_command(int argc, char** argv) {
  CLI::App app{"Tune virtual-token prompts of a frozen GPT (p-tuning, prompt tuning)."};
  std::string recipe_path;
  std::vector<std::string> overrides;
  int nproc = 0;
  int64_t stop_after = 0, iteration = -1;
  app.add_option("recipe", recipe_path, "prompt-learning recipe, e.g. recipes/ptune_tiny_cpu.yaml")->required();
  app.add_option("overrides", overrides, "dotted overrides, e.g. trainer.max_steps=100");
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
    recipe = loom::config::load_recipe(recipe_path, overrides, loom::config::RecipeKind::kPromptLearning);
    loom::config::check_input_files(recipe);
  } catch (const loom::config::RecipeError& e) {
    std::cerr << "loom ptune: invalid recipe:\n" << loom::cli::error_text(e) << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "loom ptune: " << loom::cli::error_text(e) << "\n";
    return 2;
  }
  const bool under_launcher = info.source != loom::launch::RendezvousSource::kSingleProcess;
  const int64_t world = loom::config::world_size(recipe);

  // One process prints the warnings and the resolved recipe, as loom train does: this one when it
  // starts the ranks itself (after every input check, before any rank starts; the ranks repeat
  // the plan, cheaply), else rank 0 of torchrun or srun (whose ranks all fail alike on bad input).
  // No machine-fit check as loom train's: the planner's memory model is pretraining's, and a
  // frozen base with a small prompt encoder needs far less than it would predict.
  const bool print_recipe =
      !under_launcher || (info.source != loom::launch::RendezvousSource::kLocalLauncher && info.rank == 0);
  if (print_recipe) {
    try {
      const auto plan =
          loom::ptune::plan_prompt_run(recipe, iteration >= 0 ? std::optional<int64_t>(iteration) : std::nullopt);
      for (const auto& w : recipe.origin.warnings) std::cerr << "loom ptune: warning: " << w << "\n";
      std::cerr << "# resolved recipe (the model's shape is the base's)\n" << loom::config::to_yaml(plan.recipe) << std::flush;
    } catch (const std::exception& e) {
      if (!under_launcher) return loom::cli::training_failure("ptune", e);
    }
  }
  if (!under_launcher && world > 1) return loom::cli::run_local_ranks("ptune", argc, argv, world, recipe.trainer.num_nodes);

  loom::train::TrainOptions options;
  options.stop_after_steps = stop_after;
  if (iteration >= 0) options.resume_iteration = iteration;
  try {
    return loom::ptune::run_prompt_learning(recipe, options);
  } catch (const std::exception& e) {
    return loom::cli::training_failure("ptune", e);
  }
}

}  // namespace

LOOM_REGISTER_COMMAND("ptune", "p-tuning / prompt tuning of a frozen GPT (loom ptune RECIPE [overrides])", ptune_command);
