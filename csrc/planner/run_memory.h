// Before any rank of `loom train` starts: what the run will allocate at least, from the
// planner's memory model (memory_model.h) and the sizes of the sample indices, against what
// the machine has (docs/design/hardening.md). A recipe that passes validation but cannot fit
// (hidden_size 1e9, num_layers 1e8, a billion steps of indices, 100000 local ranks) is refused
// with the numbers instead of failing in an allocation, a fork or the kernel's OOM killer.
#pragma once
#include <optional>
#include <string>

#include "config/recipe.h"

namespace loom::planner {

/// Bytes one rank allocates at least, by what needs them. A lower bound: the planner's formulas
/// count what Megatron stores; allocator slack and temporaries come on top.
struct RunMemoryEstimate {
  double model_state = 0;    ///< weights, gradients and optimizer state of the largest stage
  double activations = 0;    ///< stored activations, embedding/logits and recompute working set
  double data_indices = 0;   ///< sample, shuffle (and blending) indices of all splits, ~2x while built
  double process = 0;        ///< a rank process before the model (libraries, threads, buffers)
  bool on_device = false;    ///< model_state and activations live on the GPU, not the host
  int local_ranks = 1;       ///< ranks started on this machine (trainer.devices)
  /// Host bytes of one rank: everything, or without the device part.
  double host_per_rank() const { return process + data_indices + (on_device ? 0 : model_state + activations); }
  double device_per_rank() const { return on_device ? model_state + activations : 0; }
};

/// Estimates the run of a validated recipe.
RunMemoryEstimate estimate_run_memory(const config::Recipe& recipe);

/// The reason the run cannot fit, with the numbers and what to change, or nullopt when it may.
/// `host_available` is the host memory new processes may use (launch::available_memory_bytes);
/// nullopt skips the host check. `process_limit` (RLIMIT_NPROC) bounds the local ranks. The
/// device check runs when cluster.gpu names a GPU of the planner's table.
std::optional<std::string> run_does_not_fit(const config::Recipe& recipe, std::optional<double> host_available,
                                            std::optional<int64_t> process_limit);

}  // namespace loom::planner
