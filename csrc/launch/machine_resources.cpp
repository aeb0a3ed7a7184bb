#include "launch/machine_resources.h"

#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace loom::launch {

std::optional<double> available_memory_bytes() {
  if (const char* mib = std::getenv("LOOM_AVAILABLE_MEMORY_MIB"); mib && *mib) {
    char* end = nullptr;
    const double value = std::strtod(mib, &end);
    if (end != mib && *end == '\0' && value >= 0) return value * 1048576.0;
  }
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    double kib = 0;
    if (fields >> kib) return kib * 1024.0;
  }
  return std::nullopt;
}

std::optional<int64_t> process_limit() {
  struct rlimit limit {};
  if (getrlimit(RLIMIT_NPROC, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return std::nullopt;
  return static_cast<int64_t>(limit.rlim_cur);
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  while (bytes >= 1024.0 && unit < 6) {
    bytes /= 1024.0;
    ++unit;
  }
  char text[64];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", bytes, units[unit]);
  return text;
}

}  // namespace loom::launch
