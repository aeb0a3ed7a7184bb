#include "runtime/cpu_threads.h"

#include <ATen/Parallel.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>

namespace loom::runtime {

namespace {

// The CPUs this process may run on; the machine's count when the mask cannot be read.
int usable_cores() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) == 0 && CPU_COUNT(&mask) > 0) return CPU_COUNT(&mask);
  return int(std::max(1u, std::thread::hardware_concurrency()));
}

// OMP_NUM_THREADS when it is a positive integer, else 0.
int requested_threads() {
  const char* value = std::getenv("OMP_NUM_THREADS");
  if (!value || !*value) return 0;
  try {
    size_t used = 0;
    const int n = std::stoi(value, &used);
    return used == std::string(value).size() && n > 0 ? n : 0;
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

int use_fair_share_of_cores(int local_world_size) {
  const int requested = requested_threads();
  const int threads = requested > 0 ? requested : std::max(1, usable_cores() / std::max(1, local_world_size));
  at::set_num_threads(threads);
  return threads;
}

}  // namespace loom::runtime
