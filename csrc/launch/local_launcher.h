// Starting N local ranks of a program, the way torchrun does on one node: each child gets
// RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT. Every output line
// of a child is prefixed "[rank N] "; SIGINT/SIGTERM/SIGUSR1 received by the launcher are forwarded
// (a second SIGINT gives the ranks at most 2 s more before SIGKILL);
// when a rank fails, the others are terminated (SIGTERM, then SIGKILL after a grace period),
// so no process is left behind. No torch dependency.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace loom::launch {

struct LaunchOptions {
  std::vector<std::string> argv;                 ///< program and arguments (argv[0] is a path)
  int nproc = 1;                                 ///< number of local ranks
  std::map<std::string, std::string> extra_env;  ///< added to every rank's environment
  std::string master_addr = "127.0.0.1";
  int master_port = 0;                           ///< 0: pick a free loopback port
  double timeout_s = 0;                          ///< 0: none; else kill all ranks after this
  double grace_s = 5;                            ///< SIGTERM → SIGKILL delay when stopping ranks
  bool prefix_output = true;                     ///< "[rank N] " before each line
  bool capture_output = false;                   ///< keep each rank's output in the result
  bool echo_output = true;                       ///< write ranks' output to our stdout/stderr
  /// Terminate the other ranks when one fails (as torchrun does). Tests turn it off to check
  /// that ranks notice a dead peer by themselves.
  bool stop_all_on_failure = true;
};

struct RankExit {
  int rank = -1;
  int exit_code = 0;     ///< exit status, or 128+signal when killed by a signal
  bool signaled = false;
  std::string output;    ///< stdout+stderr of the rank (when capture_output)
  double seconds = 0;    ///< from launch to exit
  double max_rss_mib = 0;  ///< peak resident memory of the rank process (wait4), MiB
};

struct LaunchResult {
  std::vector<RankExit> ranks;
  /// The rank whose failure caused the others (-1: all succeeded), by launch/failure_report.h:
  /// a rank killed by a signal the launcher did not send or that recorded its own error, before
  /// ranks reporting a lost peer, before ranks the launcher stopped; then the earliest.
  int first_failed_rank = -1;
  bool timed_out = false;
  std::string first_error;       ///< that rank's recorded error, else its last stderr lines
  std::string failure_report;    ///< describe_failures: that rank first, then the consequences
  int interrupts = 0;            ///< SIGINTs the launcher received and forwarded (2: "stop now")
  /// Exit status for the launcher: 0, or the first failing rank's status.
  int exit_code() const;
  /// "rank 2 failed first (exit 1): <error>\nthen, as a consequence: ..." or
  /// "all N ranks succeeded".
  std::string summary() const;
};

/// For a rank's error handler: records `message` with the current time in the file named by
/// LOOM_ERROR_FILE (set by launch_local for each rank), so the launcher can tell the rank that
/// failed first from the ranks that failed because of it. Only a rank's first record counts:
/// call it before unwinding closes the rank's sockets (which makes the peers fail).
/// `consequence`: this rank stops because another rank failed. Does nothing outside the local
/// launcher.
void record_rank_error(const std::string& message, bool consequence = false);

/// Starts the ranks and waits for all of them. Throws std::runtime_error if a process cannot
/// be started (the ones already started are stopped first).
LaunchResult launch_local(const LaunchOptions& options);

/// A TCP port on 127.0.0.1 that is free now (bound and released).
int find_free_port();

/// Path of the running executable (/proc/self/exe).
std::string self_executable();

}  // namespace loom::launch
