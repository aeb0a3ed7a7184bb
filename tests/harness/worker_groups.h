// Process groups for a multi-rank test worker (torch test binaries only): one thread per rank
// (several ranks share the 2 test cores) and a short collective timeout, so a broken test fails
// instead of hanging.
#pragma once
#include <ATen/Parallel.h>

#include <chrono>
#include <memory>

#include "launch/env_rendezvous.h"
#include "runtime/process_groups.h"

namespace loom::test {

inline std::shared_ptr<runtime::ProcessGroups> worker_groups(
    int tensor_parallel, int pipeline_parallel = 1,
    std::chrono::milliseconds timeout = std::chrono::seconds(60),
    runtime::RunDevice device = {}) {
  at::set_num_threads(1);
  runtime::ProcessGroupOptions opt;
  opt.layout.tp = tensor_parallel;
  opt.layout.pp = pipeline_parallel;
  opt.timeout = timeout;
  opt.device = device;
  return runtime::ProcessGroups::create(launch::rendezvous_from_env(), opt);
}

}  // namespace loom::test
