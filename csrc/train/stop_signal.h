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

/// Why a run stops before trainer.max_steps; a larger value wins when ranks differ.
enum class StopReason : int64_t {
  kNone = 0,
  kRequested = 1,  ///< a stop signal, or the step budget of this process (tests)
  kMaxTime = 2,    ///< trainer.max_time
};

/// Collective over groups.host_world(): the largest of every rank's `local` reason, where a
/// received stop signal counts as at least kRequested. Every rank gets the same answer, so the
/// ranks stop after the same step and report the same reason (each rank's clock may reach
/// trainer.max_time a little apart).
StopReason agreed_stop_reason(runtime::ProcessGroups& groups, StopReason local);

}  // namespace loom::train
