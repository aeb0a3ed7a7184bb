#include "harness/multiprocess.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>

namespace loom::test {
namespace {
std::map<std::string, WorkerFn>& workers() {
  static std::map<std::string, WorkerFn> registry;
  return registry;
}
}  // namespace

WorkerRegistrar::WorkerRegistrar(const std::string& name, WorkerFn fn) {
  workers()[name] = std::move(fn);
}

launch::LaunchResult run_ranks(const std::string& name, int world,
                               const std::map<std::string, std::string>& env, double timeout_s,
                               bool stop_all_on_failure) {
  if (!workers().count(name)) throw std::invalid_argument("no test worker named '" + name + "'");
  launch::LaunchOptions opt;
  opt.argv = {launch::self_executable()};
  opt.nproc = world;
  opt.extra_env = env;
  opt.extra_env["LOOM_TEST_WORKER"] = name;
  opt.timeout_s = timeout_s;
  opt.grace_s = 2;
  opt.stop_all_on_failure = stop_all_on_failure;
  opt.capture_output = true;
  opt.echo_output = std::getenv("LOOM_TEST_ECHO") != nullptr;
  auto result = launch::launch_local(opt);
  if (result.exit_code() != 0 && !opt.echo_output) {
    // Show what the ranks said, so a failing test explains itself.
    for (const auto& r : result.ranks) {
      if (!r.output.empty()) std::fprintf(stderr, "--- rank %d output ---\n%s", r.rank, r.output.c_str());
    }
  }
  return result;
}

int run_worker_if_requested() {
  const char* name = std::getenv("LOOM_TEST_WORKER");
  if (!name) return -1;
  auto it = workers().find(name);
  if (it == workers().end()) {
    std::fprintf(stderr, "unknown test worker '%s'\n", name);
    return 2;
  }
  try {
    it->second();
  } catch (const std::exception& e) {
    launch::record_rank_error(e.what());
    std::fprintf(stderr, "worker %s failed: %s\n", name, e.what());
    return 1;
  }
  return 0;
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v) throw std::runtime_error(std::string("test worker: environment variable ") + name + " not set");
  return std::stoi(v);
}

std::string env_str(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : fallback;
}

}  // namespace loom::test
