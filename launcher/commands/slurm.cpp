// `loom slurm RECIPE [overrides] [--output FILE]`: writes the sbatch script that trains the
// recipe on a Slurm cluster (csrc/config/slurm_script.h). The recipe is validated first, so a
// script is never written for a recipe `loom train` would refuse.
#include <CLI/CLI.hpp>

#include <iostream>

#include "command_registry.h"
#include "config/recipe.h"
#include "config/slurm_script.h"
#include "job_file_output.h"

namespace {

int slurm_command(int argc, char** argv) {
  CLI::App app{"Write a Slurm batch script (sbatch) that trains a recipe: one task per rank, "
               "#SBATCH lines from trainer.num_nodes/devices, run.time_limit and the cluster section."};
  app.name(argc > 0 ? argv[0] : "loom slurm");
  std::string recipe_path, output = "-", loom_command = "loom";
  std::vector<std::string> overrides;
  app.add_option("recipe", recipe_path, "recipe file, e.g. recipes/gpt3_175b.yaml")->required();
  app.add_option("overrides", overrides, "dotted overrides, e.g. trainer.num_nodes=16");
  app.add_option("--output", output, "script file to write ('-' = stdout)")->capture_default_str();
  app.add_option("--loom", loom_command, "how the compute nodes run Loom (a path or a wrapper)")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  loom::config::Recipe recipe;
  try {
    recipe = loom::config::load_recipe(recipe_path, overrides);
  } catch (const std::exception& e) {
    std::cerr << "loom slurm: invalid recipe:\n" << e.what() << "\n";
    return 2;
  }
  const std::string script = loom::config::slurm_script(recipe, recipe_path, overrides, loom_command);
  return loom::cli::write_job_file("loom slurm", output, script, "sbatch");
}

}  // namespace

LOOM_REGISTER_COMMAND("slurm", "write the sbatch script that trains a recipe on a Slurm cluster", slurm_command);
