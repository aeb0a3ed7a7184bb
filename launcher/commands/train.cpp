// `loom train RECIPE.yaml [section.key=value ...]`: validates the recipe, then either starts
// trainer.devices local ranks of itself (when no launcher variables are set) or, as one rank
// under the local launcher, torchrun (--no-python) or srun, trains.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdlib>
#include <iostream>
#include <optional>

#include "command_registry.h"
#include "error_text.h"
#include "local_ranks.h"
#include "training_failure.h"
#include "config/derived.h"
#include "config/recipe.h"
#include "data/data_error.h"
#include "launch/env_rendezvous.h"
#include "launch/local_launcher.h"
#include "launch/machine_resources.h"
#include "launch/run_lock.h"
#include "planner/run_memory.h"
#include "train/checkpoint.h"
#include "train/pretraining_task.h"

namespace {

// What `loom train` was asked.
struct TrainArgs {
  std::string recipe_path;
  std::vector<std::string> overrides;
  int nproc = 0;
  int64_t stop_after = 0;
  int64_t iteration = -1;
};

void add_train_flags(CLI::App& app, TrainArgs& a) {
  app.add_option("recipe", a.recipe_path, "recipe file, e.g. recipes/gpt3_tiny_cpu.yaml")->required();
  app.add_option("overrides", a.overrides, "dotted overrides, e.g. trainer.max_steps=100");
  app.add_option("--nproc", a.nproc, "local ranks to start (sets trainer.devices)");
  app.add_option("--stop-after-steps", a.stop_after,
                 "save and exit after this many steps, as on SIGTERM (for resume tests)");
  app.add_option("--iteration", a.iteration,
                 "resume from this checkpoint iteration instead of the latest (e.g. when the newest is damaged)")
      ->check(CLI::Range(int64_t{0}, loom::train::kMaxIteration));
}

// The recipe with its overrides, its input files checked; nullopt (after saying why) when it
// is bad input.
std::optional<loom::config::Recipe> load_train_recipe(const TrainArgs& a) {
  try {
    loom::config::Recipe recipe = loom::config::load_recipe(a.recipe_path, a.overrides);
    loom::config::check_input_files(recipe);
    return recipe;
  } catch (const loom::config::RecipeError& e) {
    std::cerr << "loom train: invalid recipe:\n" << loom::cli::error_text(e) << "\n";
  } catch (const std::exception& e) {
    std::cerr << "loom train: " << loom::cli::error_text(e) << "\n";
  }
  return std::nullopt;
}

// What the run will allocate, against this machine, before any rank starts (the ranks of the
// local launcher were checked by it; torchrun's and srun's check themselves). False after
// saying why it does not fit.
bool fits_this_machine(const loom::config::Recipe& recipe, const loom::launch::RendezvousInfo& info) {
  if (info.source == loom::launch::RendezvousSource::kLocalLauncher) return true;
  if (const auto why = loom::planner::run_does_not_fit(recipe, loom::launch::available_memory_bytes(),
                                                       loom::launch::process_limit())) {
    std::cerr << "loom train: " << *why << "\n";
    return false;
  }
  return true;
}

// One process prints the recipe's warnings and the resolved recipe: this one when it starts the
// ranks itself, else rank 0 of torchrun or srun (not the local launcher's ranks: their parent did).
void print_resolved_recipe(const loom::config::Recipe& recipe, const loom::launch::RendezvousInfo& info) {
  const bool under_launcher = info.source != loom::launch::RendezvousSource::kSingleProcess;
  const bool print_recipe =
      !under_launcher || (info.source != loom::launch::RendezvousSource::kLocalLauncher && info.rank == 0);
  if (!print_recipe) return;
  for (const auto& w : recipe.origin.warnings) std::cerr << "loom train: warning: " << w << "\n";
  std::cerr << "# resolved recipe\n" << loom::config::to_yaml(recipe) << std::flush;
}

// Trains as this process's rank; a failure ends it with training_failure's status.
int train_as_rank(const loom::config::Recipe& recipe, const TrainArgs& a) {
  try {
    loom::train::TrainOptions options;
    options.stop_after_steps = a.stop_after;
    if (a.iteration >= 0) options.resume_iteration = a.iteration;
    return loom::train::run_training(recipe, options);
  } catch (const std::exception& e) {
    return loom::cli::training_failure("train", e);
  }
}

int train_command(int argc, char** argv) {
  CLI::App app{"Train a GPT model from a YAML recipe (NeMo Megatron field names)."};
  TrainArgs args;
  add_train_flags(app, args);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (args.nproc > 0) args.overrides.push_back("trainer.devices=" + std::to_string(args.nproc));
  const std::optional<loom::config::Recipe> recipe = load_train_recipe(args);
  if (!recipe) return 2;

  loom::launch::RendezvousInfo info;
  try {
    info = loom::launch::rendezvous_from_env();
  } catch (const std::exception& e) {
    std::cerr << "loom train: " << loom::cli::error_text(e) << "\n";
    return 2;
  }
  if (!fits_this_machine(*recipe, info)) return 2;
  print_resolved_recipe(*recipe, info);
  const int64_t world = loom::config::world_size(*recipe);
  if (info.source == loom::launch::RendezvousSource::kSingleProcess && world > 1)
    return loom::cli::run_local_ranks("train", argc, argv, world, recipe->trainer.num_nodes);
  return train_as_rank(*recipe, args);
}

}  // namespace

LOOM_REGISTER_COMMAND("train", "train a GPT model from a YAML recipe", train_command);
