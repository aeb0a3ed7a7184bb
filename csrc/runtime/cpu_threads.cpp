#include "runtime/cpu_threads.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <thread>

namespace loom::runtime {

int use_fair_share_of_cores(int local_world_size) {
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = std::max(1, cores / std::max(1, local_world_size));
  at::set_num_threads(threads);
  return threads;
}

}  // namespace loom::runtime
