// Where a rank learns who it is: the environment set by torchrun, Slurm (srun) or Loom's own
// local launcher (launch/local_launcher.h). No torch dependency; the runtime turns this into a
// c10d store and process groups (runtime/process_groups.h).
#pragma once
#include <functional>
#include <optional>
#include <string>

namespace loom::launch {

enum class RendezvousSource { kLocalLauncher, kTorchrun, kSlurm, kSingleProcess };

struct RendezvousInfo {
  RendezvousSource source = RendezvousSource::kSingleProcess;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  /// torchrun with TORCHELASTIC_USE_AGENT_STORE=True: every rank (rank 0 too) is a client of
  /// the agent's TCPStore and keys live under store_prefix.
  bool use_agent_store = false;
  std::string store_prefix;   ///< "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>" or ""
  /// Whether this process must host the TCPStore server (rank 0, no agent store).
  bool is_store_server() const { return rank == 0 && !use_agent_store; }
};

/// Reads a variable; std::nullopt when unset. Injected so tests can pass a fake environment.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup process_env();

/// Decides the source and fills RendezvousInfo:
/// - torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
///   TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_RESTART_COUNT (present: TORCHELASTIC_RUN_ID or
///   GROUP_RANK; Loom's local launcher sets LOOM_LOCAL_LAUNCHER=1 instead);
/// - Slurm: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE or
///   SLURM_TASKS_PER_NODE, master = MASTER_ADDR or the first host of SLURM_JOB_NODELIST
///   (expanded from forms like "node[03-05,07],gpu1"), port = MASTER_PORT or
///   `default_slurm_port` (29500) + SLURM_JOB_ID % 1000;
/// - nothing set: a single process.
/// Throws std::invalid_argument naming the variable when one is malformed or out of range
/// (e.g. RANK >= WORLD_SIZE).
RendezvousInfo rendezvous_from_env(const EnvLookup& env = process_env(),
                                   int default_slurm_port = 29500);

/// First host name of a Slurm node list: "node[03-05,07],gpu1" → "node03".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace loom::launch
