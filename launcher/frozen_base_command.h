// The command line of the training commands over a frozen pretrained base, `loom ptune` and
// `loom finetune` (RECIPE [overrides] [--nproc N] [--stop-after-steps K] [--iteration N]): one
// driver for both, as both run the one training loop (docs/architecture.md, "One training loop").
// Everything that can be checked before a rank starts is (the recipe, the base checkpoint and
// tokenizer, the task's data, the layout with the base's shape); one process prints the warnings
// and the resolved recipe: this one when it starts the ranks itself, else rank 0 of torchrun or
// srun (whose ranks all fail alike on bad input). No machine-fit check as loom train's: the
// planner's memory model is pretraining's, and a frozen base needs far less than it predicts.
// Exit status 2 for bad input, 1 for a runtime failure.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "error_text.h"
#include "local_ranks.h"
#include "training_failure.h"
#include "config/derived.h"
#include "config/recipe.h"
#include "launch/env_rendezvous.h"
#include "train/checkpoint.h"
#include "train/training_loop.h"

namespace loom::cli {

struct FrozenBaseCommand {
  std::string name;              ///< "ptune": the command word, in every message
  std::string description;       ///< the help's first line
  std::string recipe_example;    ///< e.g. "recipes/ptune_tiny_cpu.yaml"
  std::string override_example;  ///< e.g. "trainer.max_steps=100"
  config::RecipeKind kind;
  /// The resolved recipe (the base's shape adopted) of `recipe`, resuming at the iteration given.
  std::function<config::Recipe(const config::Recipe&, std::optional<int64_t>)> resolve;
  std::function<int(const config::Recipe&, const train::TrainOptions&)> run;
  /// Optional: `--show-examples N` prints the first N training rows (stdout) instead of training.
  std::function<void(const config::Recipe&, int64_t)> show_examples;
};

inline int run_frozen_base_command(const FrozenBaseCommand& c, int argc, char** argv) {
  CLI::App app{c.description};
  std::string recipe_path;
  std::vector<std::string> overrides;
  int nproc = 0;
  int64_t stop_after = 0, iteration = -1;
  app.add_option("recipe", recipe_path, "recipe, e.g. " + c.recipe_example)->required();
  app.add_option("overrides", overrides, "dotted overrides, e.g. " + c.override_example);
  app.add_option("--nproc", nproc, "local ranks to start (sets trainer.devices)")->check(CLI::Range(1, 4096));
  app.add_option("--stop-after-steps", stop_after, "save and exit after this many steps, as on SIGTERM")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--iteration", iteration, "resume from this checkpoint iteration instead of the latest")
      ->check(CLI::Range(int64_t{0}, train::kMaxIteration));
  int64_t show = -1;
  if (c.show_examples)
    app.add_option("--show-examples", show, "print the first N training rows as the model takes them, then exit")
        ->check(CLI::NonNegativeNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (nproc > 0) overrides.push_back("trainer.devices=" + std::to_string(nproc));

  const std::string prefix = "loom " + c.name + ": ";
  launch::RendezvousInfo info;
  config::Recipe recipe;
  try {
    info = launch::rendezvous_from_env();
    recipe = config::load_recipe(recipe_path, overrides, c.kind);
    config::check_input_files(recipe);
  } catch (const config::RecipeError& e) {
    std::cerr << prefix << "invalid recipe:\n" << error_text(e) << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << prefix << error_text(e) << "\n";
    return 2;
  }
  if (show >= 0) {
    try {
      c.show_examples(recipe, show);
      return 0;
    } catch (const std::exception& e) {
      return training_failure(c.name, e);
    }
  }
  const bool under_launcher = info.source != launch::RendezvousSource::kSingleProcess;
  const int64_t world = config::world_size(recipe);
  const std::optional<int64_t> resume = iteration >= 0 ? std::optional<int64_t>(iteration) : std::nullopt;

  const bool print_recipe = !under_launcher || (info.source != launch::RendezvousSource::kLocalLauncher && info.rank == 0);
  if (print_recipe) {
    try {
      const config::Recipe resolved = c.resolve(recipe, resume);
      for (const auto& w : recipe.origin.warnings) std::cerr << prefix << "warning: " << w << "\n";
      std::cerr << "# resolved recipe (the model's shape is the base's)\n" << config::to_yaml(resolved) << std::flush;
    } catch (const std::exception& e) {
      if (!under_launcher) return training_failure(c.name, e);
    }
  }
  if (!under_launcher && world > 1) return run_local_ranks(c.name, argc, argv, world, recipe.trainer.num_nodes);

  train::TrainOptions options;
  options.stop_after_steps = stop_after;
  options.resume_iteration = resume;
  try {
    return c.run(recipe, options);
  } catch (const std::exception& e) {
    return training_failure(c.name, e);
  }
}

}  // namespace loom::cli
