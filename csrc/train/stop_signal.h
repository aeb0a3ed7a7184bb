// Preemption: SIGTERM or SIGUSR1 (what Slurm and torchrun send before killing a job), or a
// first SIGINT (Ctrl-C, as NeMo users expect), asks the run to save a checkpoint and exit; a
// second SIGINT ends the process at once, without the save. Every rank must stop after the
// same step, so the request is agreed on with a host all-reduce (MAX) of one flag per rank on
// the Gloo host group (a host value: it stays off NCCL and does not wait for the device).
#pragma once
#include <cstdint>

#include "runtime/process_groups.h"

namespace loom::train {

/// Routes SIGTERM, SIGUSR1 and the first SIGINT to the stop flag of this process; a second
/// SIGINT kills it (idempotent).
void install_stop_signal_handlers();

/// Collective over groups.host_world(): true on every rank when any rank received a stop
/// signal or `local_request` is set on any rank.
bool stop_requested(runtime::ProcessGroups& groups, bool local_request);

}  // namespace loom::train
