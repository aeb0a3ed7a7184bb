// Intra-op threads of a rank: the cores this process may run on (its CPU affinity: taskset,
// a container's cpuset) shared evenly by the ranks started on the node, so that N ranks on N·k
// cores do not oversubscribe them (what torchrun users set OMP_NUM_THREADS for). An
// OMP_NUM_THREADS the user set (a positive integer) is taken as it is, as PyTorch does.
#pragma once

namespace loom::runtime {

/// Sets ATen's intra-op thread count to OMP_NUM_THREADS when set to a positive integer, else
/// max(1, usable cores / local_world_size), and returns it.
int use_fair_share_of_cores(int local_world_size);

}  // namespace loom::runtime
