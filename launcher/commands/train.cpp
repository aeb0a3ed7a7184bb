// `loom train RECIPE.yaml [section.key=value ...]`: validates the recipe, then either starts
// trainer.devices local ranks of itself (when no launcher variables are set) or, as one rank
// under the local launcher, torchrun (--no-python) or srun, trains.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdlib>
#include <iostream>

#include "command_registry.h"
#include "error_text.h"
#include "local_ranks.h"
#include "config/derived.h"
#include "config/recipe.h"
#include "data/data_error.h"
#include "launch/env_rendezvous.h"
#include "launch/local_launcher.h"
#include "launch/machine_resources.h"
#include "launch/run_lock.h"
#include "planner/run_memory.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace {

int train_command(int argc, char** argv) {
  CLI::App app{"Train a GPT model from a YAML recipe (NeMo Megatron field names)."};
  std::string recipe_path;
  std::vector<std::string> overrides;
  int nproc = 0;
  int64_t stop_after = 0;
  int64_t iteration = -1;
  app.add_option("recipe", recipe_path, "recipe file, e.g. recipes/gpt3_tiny_cpu.yaml")->required();
  app.add_option("overrides", overrides, "dotted overrides, e.g. trainer.max_steps=100");
  app.add_option("--nproc", nproc, "local ranks to start (sets trainer.devices)");
  app.add_option("--stop-after-steps", stop_after,
                 "save and exit after this many steps, as on SIGTERM (for resume tests)");
  app.add_option("--iteration", iteration,
                 "resume from this checkpoint iteration instead of the latest (e.g. when the newest is damaged)")
      ->check(CLI::Range(int64_t{0}, loom::train::kMaxIteration));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (nproc > 0) overrides.push_back("trainer.devices=" + std::to_string(nproc));

  loom::config::Recipe recipe;
  try {
    recipe = loom::config::load_recipe(recipe_path, overrides);
    loom::config::check_input_files(recipe);
  } catch (const loom::config::RecipeError& e) {
    std::cerr << "loom train: invalid recipe:\n" << loom::cli::error_text(e) << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "loom train: " << loom::cli::error_text(e) << "\n";
    return 2;
  }

  loom::launch::RendezvousInfo info;
  try {
    info = loom::launch::rendezvous_from_env();
  } catch (const std::exception& e) {
    std::cerr << "loom train: " << loom::cli::error_text(e) << "\n";
    return 2;
  }
  const int64_t world = loom::config::world_size(recipe);
  const bool under_launcher = info.source != loom::launch::RendezvousSource::kSingleProcess;
  // What the run will allocate, against this machine, before any rank starts (the ranks of
  // the local launcher were checked by it; torchrun's and srun's check themselves).
  if (info.source != loom::launch::RendezvousSource::kLocalLauncher) {
    if (const auto why = loom::planner::run_does_not_fit(recipe, loom::launch::available_memory_bytes(),
                                                         loom::launch::process_limit())) {
      std::cerr << "loom train: " << *why << "\n";
      return 2;
    }
  }
  const bool print_recipe = !under_launcher || (info.source != loom::launch::RendezvousSource::kLocalLauncher && info.rank == 0);
  if (print_recipe) {
    for (const auto& w : recipe.origin.warnings) std::cerr << "loom train: warning: " << w << "\n";
    std::cerr << "# resolved recipe\n" << loom::config::to_yaml(recipe) << std::flush;
  }

  if (!under_launcher && world > 1)
    return loom::cli::run_local_ranks("train", argc, argv, world, recipe.trainer.num_nodes);

  try {
    loom::train::TrainOptions options;
    options.stop_after_steps = stop_after;
    if (iteration >= 0) options.resume_iteration = iteration;
    return loom::train::run_training(recipe, options);
  } catch (const loom::launch::RunLockError& e) {
    loom::launch::record_rank_error(loom::cli::error_text(e));
    std::cerr << "loom train: " << loom::cli::error_text(e) << "\n";
    return 2;
  } catch (const loom::data::DataError& e) {
    // Bad data is bad input, like a missing data file (exit 2).
    loom::launch::record_rank_error(loom::cli::error_text(e));
    std::cerr << "loom train: data error: " << loom::cli::error_text(e) << "\n";
    return 2;
  } catch (const std::invalid_argument& e) {
    loom::launch::record_rank_error(loom::cli::error_text(e));
    std::cerr << "loom train: error: " << loom::cli::error_text(e) << "\n";
    return 2;
  } catch (const loom::train::CheckpointError& e) {
    loom::launch::record_rank_error(loom::cli::error_text(e));
    std::cerr << "loom train: checkpoint error: " << loom::cli::error_text(e) << "\n";
    return 2;
  } catch (const std::exception& e) {
    loom::launch::record_rank_error(loom::cli::error_text(e));
    std::cerr << "loom train: error: " << loom::cli::error_text(e) << "\n";
    return 1;
  }
}

}  // namespace

LOOM_REGISTER_COMMAND("train", "train a GPT model from a YAML recipe", train_command);
