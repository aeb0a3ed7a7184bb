// Starting a run's ranks on this machine (`loom train`, `loom ptune`, `loom generate`, `loom eval`
// without a launcher): the command re-executes itself once per rank with the rendezvous
// variables set; a multi-node
// recipe needs torchrun or srun instead. Ranks get 120 s to save a checkpoint when stopped;
// a second Ctrl-C stops them at once (exit 130).
#pragma once
#include <fmt/format.h>

#include <csignal>
#include <cstdint>
#include <iostream>
#include <string>

#include "error_text.h"
#include "launch/local_launcher.h"

namespace loom::cli {

/// Runs `loom <command> argv[1..]` on `world` local ranks and returns the exit status to give
/// (the first failing rank's, 130 after two interrupts, 2 for a multi-node recipe, 1 when the
/// ranks cannot be started), after printing what failed.
inline int run_local_ranks(const std::string& command, int argc, char** argv, int64_t world, int64_t num_nodes) {
  const std::string who = "loom " + command + ": ";
  if (num_nodes > 1) {
    std::cerr << fmt::format("{}trainer.num_nodes = {} needs a multi-node launcher: run `loom {}` under "
                             "torchrun --no-python or srun on every node\n", who, num_nodes, command);
    return 2;
  }
  launch::LaunchOptions opt;
  opt.argv = {launch::self_executable(), command};
  for (int i = 1; i < argc; ++i) opt.argv.push_back(argv[i]);
  opt.nproc = static_cast<int>(world);
  opt.grace_s = 120;  // a preempted run saves a checkpoint before exiting
  try {
    auto result = launch::launch_local(opt);
    if (result.exit_code() != 0 && result.interrupts >= 2) {
      std::cerr << who << "interrupted twice: the ranks stopped at once, without saving\n";
      return 128 + SIGINT;
    }
    if (result.exit_code() != 0) std::cerr << who << result.summary() << "\n";
    return result.exit_code();
  } catch (const std::exception& e) {
    std::cerr << who << "cannot start the ranks: " << error_text(e) << "\n";
    return 1;
  }
}

/// Runs `loom <command> argv[1..]` on `nproc` local ranks of a command whose stdout is rank 0's
/// result (generate's text, eval's table), so output lines are not prefixed with the rank.
/// Returns the first failing rank's exit status (its summary printed), 1 when the ranks cannot
/// be started.
inline int run_local_ranks_for_output(const std::string& command, int argc, char** argv, int nproc) {
  launch::LaunchOptions opt;
  opt.argv = {launch::self_executable(), command};
  for (int i = 1; i < argc; ++i) opt.argv.push_back(argv[i]);
  opt.nproc = nproc;
  opt.prefix_output = false;
  try {
    auto result = launch::launch_local(opt);
    if (result.exit_code() != 0) std::cerr << "loom " << command << ": " << result.summary() << "\n";
    return result.exit_code();
  } catch (const std::exception& e) {
    std::cerr << "loom " << command << ": cannot start the ranks: " << error_text(e) << "\n";
    return 1;
  }
}

}  // namespace loom::cli
