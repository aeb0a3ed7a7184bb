// Intra-op threads of a rank: the node's cores shared evenly by the ranks started on it, so that
// N ranks on N·k cores do not oversubscribe them (what torchrun users set OMP_NUM_THREADS for).
#pragma once

namespace loom::runtime {

/// Sets ATen's intra-op thread count to max(1, cores / local_world_size) and returns it.
int use_fair_share_of_cores(int local_world_size);

}  // namespace loom::runtime
