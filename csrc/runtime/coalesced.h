// One collective for many small tensors: packing them into one buffer per dtype saves the
// per-call latency that dominates small all-reduces (Megatron's coalesced gradient reductions).
#pragma once
#include <ATen/core/Tensor.h>

#include <vector>

#include "runtime/communicator.h"

namespace loom::runtime {

/// SUM all-reduces every tensor of `tensors` in place over `group`, one packed all-reduce per
/// dtype. Undefined tensors are skipped. No-op for a group of size 1.
void all_reduce_coalesced(const std::vector<at::Tensor>& tensors, Communicator& group);

}  // namespace loom::runtime
