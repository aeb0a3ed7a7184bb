#include "config/slurm_script.h"

#include <fmt/format.h>

#include "config/derived.h"

namespace loom::config {

std::string shell_quote(const std::string& arg) {
  if (!arg.empty() && arg.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
                                            "_@%+=:,./-") == std::string::npos)
    return arg;
  std::string out = "'";
  for (char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string slurm_script(const Recipe& r, const std::string& recipe_path, const std::vector<std::string>& overrides,
                         const std::string& loom_command) {
  const ClusterConfig& c = r.cluster;
  const std::string run_dir = run_directory(r);
  std::string s = "#!/bin/bash\n";
  s += fmt::format("# Written by `loom slurm` for {}; submit with `sbatch <this file>`.\n", recipe_path);
  s += fmt::format("#SBATCH --job-name={}\n", shell_quote(c.job_name_prefix + r.run.name));
  s += fmt::format("#SBATCH --nodes={}\n", r.trainer.num_nodes);
  s += fmt::format("#SBATCH --ntasks-per-node={}\n", r.trainer.devices);
  if (r.trainer.accelerator == Accelerator::kGpu) s += fmt::format("#SBATCH --gpus-per-node={}\n", c.gpus_per_node);
  if (c.partition) s += fmt::format("#SBATCH --partition={}\n", shell_quote(*c.partition));
  if (c.account) s += fmt::format("#SBATCH --account={}\n", shell_quote(*c.account));
  if (r.run.time_limit) s += fmt::format("#SBATCH --time={}\n", shell_quote(*r.run.time_limit));
  if (c.exclusive) s += "#SBATCH --exclusive\n";
  s += fmt::format("#SBATCH --output={}\n", shell_quote(run_dir + "/slurm-%j.out"));
  s += "set -euo pipefail\n";
  // sbatch opens --output before the script runs: the directory must exist at submission;
  // created here too so that a resubmitted script works after the directory was removed.
  s += fmt::format("mkdir -p {}\n", shell_quote(run_dir));
  s += "# One task per rank; `loom train` finds its rank, world and master in the Slurm environment.\n";
  s += "srun --kill-on-bad-exit=1";
  if (c.container_image) {
    s += " --container-image=" + shell_quote(*c.container_image);
    if (!c.container_mounts.empty()) {
      std::string mounts;
      for (const auto& m : c.container_mounts) mounts += (mounts.empty() ? "" : ",") + m;
      s += " --container-mounts=" + shell_quote(mounts);
    }
  }
  s += " \\\n    " + loom_command + " train " + shell_quote(recipe_path);
  for (const auto& o : overrides) s += " " + shell_quote(o);
  return s + "\n";
}

}  // namespace loom::config
