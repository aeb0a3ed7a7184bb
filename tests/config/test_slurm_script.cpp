// `loom slurm` scripts: exact bytes for a GPU recipe with a full cluster section, the CPU
// variant, and shell quoting.
#include <catch2/catch.hpp>

#include "config/slurm_script.h"
#include "config_test_util.h"

using namespace loom::config;
using loom::config::test::kMinimalRecipe;

TEST_CASE("shell quoting leaves safe words alone and single-quotes the rest", "[config][slurm]") {
  CHECK(shell_quote("trainer.num_nodes=16") == "trainer.num_nodes=16");
  CHECK(shell_quote("model.optim.betas=[0.9,0.95]") == "'model.optim.betas=[0.9,0.95]'");
  CHECK(shell_quote("it's") == "'it'\\''s'");
  CHECK(shell_quote("") == "''");
  CHECK(shell_quote("a b") == "'a b'");
}

TEST_CASE("a GPU recipe with a cluster section gives the full sbatch script", "[config][slurm]") {
  const std::vector<std::string> overrides = {
      "trainer.accelerator=gpu", "trainer.precision=bf16", "trainer.num_nodes=2", "trainer.devices=8",
      "cluster.partition=batch", "cluster.account=llm", "cluster.container_image=nvcr.io/x/loom:1",
      "cluster.container_mounts=[/lustre:/lustre,/home:/home]", "run.name=gpt_run", "run.time_limit=0-04:00:00",
      "exp_manager.explicit_log_dir=/lustre/runs/gpt run"};
  const Recipe r = load_recipe_from_string(kMinimalRecipe, "r.yaml", overrides);
  const std::string want =
      "#!/bin/bash\n"
      "# Written by `loom slurm` for recipes/r.yaml; submit with `sbatch <this file>`.\n"
      "#SBATCH --job-name=loom-gpt_run\n"
      "#SBATCH --nodes=2\n"
      "#SBATCH --ntasks-per-node=8\n"
      "#SBATCH --gpus-per-node=8\n"
      "#SBATCH --partition=batch\n"
      "#SBATCH --account=llm\n"
      "#SBATCH --time=0-04:00:00\n"
      "#SBATCH --exclusive\n"
      "#SBATCH --output='/lustre/runs/gpt run/slurm-%j.out'\n"
      "set -euo pipefail\n"
      "mkdir -p '/lustre/runs/gpt run'\n"
      "# One task per rank; `loom train` finds its rank, world and master in the Slurm environment.\n"
      "srun --kill-on-bad-exit=1 --container-image=nvcr.io/x/loom:1 --container-mounts=/lustre:/lustre,/home:/home \\\n"
      "    loom train recipes/r.yaml trainer.accelerator=gpu trainer.precision=bf16 trainer.num_nodes=2 "
      "trainer.devices=8 cluster.partition=batch cluster.account=llm cluster.container_image=nvcr.io/x/loom:1 "
      "'cluster.container_mounts=[/lustre:/lustre,/home:/home]' run.name=gpt_run run.time_limit=0-04:00:00 "
      "'exp_manager.explicit_log_dir=/lustre/runs/gpt run'\n";
  CHECK(slurm_script(r, "recipes/r.yaml", overrides) == want);
}

TEST_CASE("a CPU recipe asks for no GPUs and no container", "[config][slurm]") {
  const Recipe r = load_recipe_from_string(kMinimalRecipe, "r.yaml", {"cluster.exclusive=false"});
  const std::string s = slurm_script(r, "r.yaml", {}, "/opt/loom/bin/loom");
  CHECK_THAT(s, Catch::Contains("#SBATCH --ntasks-per-node=4\n"));
  CHECK_THAT(s, !Catch::Contains("--gpus-per-node"));
  CHECK_THAT(s, !Catch::Contains("--exclusive"));
  CHECK_THAT(s, !Catch::Contains("--container-image"));
  CHECK_THAT(s, Catch::Contains("#SBATCH --output=runs/megatron_gpt/slurm-%j.out\n"));
  CHECK_THAT(s, Catch::EndsWith("srun --kill-on-bad-exit=1 \\\n    /opt/loom/bin/loom train r.yaml\n"));
}
