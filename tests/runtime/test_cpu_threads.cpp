// A rank's intra-op threads: the process's usable cores shared by the node's ranks, or the
// user's OMP_NUM_THREADS.
#include <catch2/catch.hpp>

#include <ATen/Parallel.h>
#include <sched.h>

#include <cstdlib>

#include "runtime/cpu_threads.h"

using loom::runtime::use_fair_share_of_cores;

namespace {

int affinity_cores() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  REQUIRE(sched_getaffinity(0, sizeof(mask), &mask) == 0);
  return CPU_COUNT(&mask);
}

// Sets OMP_NUM_THREADS (nullptr: unset) for the scope and restores it after.
struct OmpThreads {
  std::string saved;
  bool had;
  explicit OmpThreads(const char* value) : had(std::getenv("OMP_NUM_THREADS") != nullptr) {
    if (had) saved = std::getenv("OMP_NUM_THREADS");
    value ? setenv("OMP_NUM_THREADS", value, 1) : unsetenv("OMP_NUM_THREADS");
  }
  ~OmpThreads() {
    had ? setenv("OMP_NUM_THREADS", saved.c_str(), 1) : unsetenv("OMP_NUM_THREADS");
    at::set_num_threads(1);
  }
};

}  // namespace

TEST_CASE("threads are the usable cores shared by the node's ranks") {
  OmpThreads env(nullptr);
  const int cores = affinity_cores();
  CHECK(use_fair_share_of_cores(1) == cores);
  CHECK(at::get_num_threads() == cores);
  CHECK(use_fair_share_of_cores(cores * 4) == 1);
  for (const char* ignored : {"", "0", "-2", "two", "3x"}) {
    OmpThreads bad(ignored);
    CHECK(use_fair_share_of_cores(1) == cores);
  }
}

TEST_CASE("a user's OMP_NUM_THREADS is taken as it is") {
  OmpThreads env("3");
  CHECK(use_fair_share_of_cores(2) == 3);
  CHECK(at::get_num_threads() == 3);
}
