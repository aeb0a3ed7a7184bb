// What this machine can give a run, read before any rank starts (docs/design/hardening.md):
// host memory available to new processes and the processes this user may still start.
// Linux only (/proc/meminfo, getrlimit). No torch.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace loom::launch {

/// MemAvailable of /proc/meminfo in bytes (memory new processes can use without swapping),
/// or nullopt when it cannot be read. LOOM_AVAILABLE_MEMORY_MIB, when set, replaces it (tests,
/// and machines whose limit is a cgroup /proc/meminfo does not show).
std::optional<double> available_memory_bytes();

/// RLIMIT_NPROC's soft limit (processes and threads of this user), nullopt when unlimited.
std::optional<int64_t> process_limit();

/// "12.3 GiB", "512.0 MiB", "1.5 TiB": bytes for messages.
std::string format_bytes(double bytes);

}  // namespace loom::launch
