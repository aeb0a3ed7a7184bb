// Slurm batch scripts for a recipe (`loom slurm`): the #SBATCH header from trainer.num_nodes /
// devices, run.time_limit and the cluster section (NeMo Framework Launcher's cluster config:
// partition, account, job_name_prefix, gpus_per_node, exclusive, container_image and
// container_mounts for pyxis/enroot), and one `srun` starting one task per rank that runs
// `loom train` (env_rendezvous.h reads SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID and the first
// host of SLURM_JOB_NODELIST; the port is 29500 + SLURM_JOB_ID % 1000 unless MASTER_PORT is set).
#pragma once
#include <string>
#include <vector>

#include "config/recipe.h"

namespace loom::config {

/// `arg` quoted for a POSIX shell: as is when made only of safe characters
/// ([A-Za-z0-9_@%+=:,./-]), else in single quotes with embedded quotes escaped.
std::string shell_quote(const std::string& arg);

/// The sbatch script for `recipe` (loaded from `recipe_path` with `overrides`): #SBATCH lines
/// --job-name=<job_name_prefix><run.name>, --nodes, --ntasks-per-node (= devices),
/// --gpus-per-node (GPU recipes), --partition / --account / --time (when set), --exclusive
/// (when set), --output=<run dir>/slurm-%j.out; then `srun --kill-on-bad-exit=1` with
/// --container-image / --container-mounts when an image is set, running
/// `<loom_command> train <recipe_path> <overrides...>` (the command as written, so it may be a
/// path or a wrapper; the recipe path and overrides shell-quoted).
std::string slurm_script(const Recipe& recipe, const std::string& recipe_path,
                         const std::vector<std::string>& overrides, const std::string& loom_command = "loom");

}  // namespace loom::config
