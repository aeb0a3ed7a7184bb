// Multi-process tests: run a named worker function in N child processes of the test binary,
// each with RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT set as torchrun would, so the
// workers rendezvous over loopback exactly like real ranks.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "launch/local_launcher.h"

namespace loom::test {

using WorkerFn = std::function<void()>;

/// Registers `fn` under `name`; a child process started with LOOM_TEST_WORKER=name runs it
/// and exits 0 when it returns, 1 (with the message on stderr) when it throws.
struct WorkerRegistrar {
  WorkerRegistrar(const std::string& name, WorkerFn fn);
};

/// Runs worker `name` on `world` local ranks; `env` adds variables (e.g. parameters).
/// `timeout_s` bounds the whole run: ranks still alive then are killed and reported.
/// `stop_all_on_failure` = false lets the other ranks find a failure by themselves.
launch::LaunchResult run_ranks(const std::string& name, int world,
                               const std::map<std::string, std::string>& env = {},
                               double timeout_s = 120.0, bool stop_all_on_failure = true);

/// Dispatch used by main(): runs the worker named by LOOM_TEST_WORKER if set.
/// Returns -1 when no worker was requested, else the process exit status.
int run_worker_if_requested();

/// Integer environment variable for worker parameters; throws if missing or not an integer.
int env_int(const char* name);
/// Environment variable, or `fallback` when missing.
std::string env_str(const char* name, const std::string& fallback = "");

}  // namespace loom::test

#define LOOM_WORKER_CAT2(a, b) a##b
#define LOOM_WORKER_CAT(a, b) LOOM_WORKER_CAT2(a, b)
/// Defines a worker function: LOOM_WORKER("name") { ... body runs on every rank ... }
#define LOOM_WORKER(NAME)                                                              \
  static void LOOM_WORKER_CAT(loom_worker_fn_, __LINE__)();                            \
  static ::loom::test::WorkerRegistrar LOOM_WORKER_CAT(loom_worker_reg_, __LINE__)(    \
      NAME, &LOOM_WORKER_CAT(loom_worker_fn_, __LINE__));                              \
  static void LOOM_WORKER_CAT(loom_worker_fn_, __LINE__)()

/// Check inside a worker: throws with file:line and the expression when false.
#define LOOM_WCHECK(cond, ...)                                                           \
  do {                                                                                   \
    if (!(cond))                                                                         \
      throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + \
                               ": check failed: " #cond " " __VA_ARGS__);               \
  } while (0)
