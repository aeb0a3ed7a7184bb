#include "launch/env_rendezvous.h"

#include <cstdlib>
#include <stdexcept>

namespace loom::launch {
namespace {

int parse_int(const EnvLookup& env, const std::string& name, int lo, int hi) {
  auto value = env(name);
  if (!value) throw std::invalid_argument("environment variable " + name + " is not set");
  try {
    size_t used = 0;
    long v = std::stol(*value, &used);
    if (used != value->size()) throw std::invalid_argument("trailing characters");
    if (v < lo || v > hi) {
      throw std::invalid_argument("environment variable " + name + "=" + *value +
                                  " is out of range [" + std::to_string(lo) + ", " +
                                  std::to_string(hi) + "]");
    }
    return static_cast<int>(v);
  } catch (const std::out_of_range&) {
    throw std::invalid_argument("environment variable " + name + "=" + *value + " is out of range");
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()).rfind("environment variable", 0) == 0) throw;
    throw std::invalid_argument("environment variable " + name + "='" + *value +
                                "' is not an integer");
  }
}

int parse_int_or(const EnvLookup& env, const std::string& name, int fallback, int lo, int hi) {
  return env(name) ? parse_int(env, name, lo, hi) : fallback;
}

bool truthy(const std::optional<std::string>& v) {
  return v && (*v == "1" || *v == "True" || *v == "true" || *v == "TRUE");
}

constexpr int kMaxRanks = 1 << 24;

}  // namespace

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  };
}

std::string first_slurm_host(const std::string& nodelist) {
  // Grammar: host(,host)* where host = prefix["[" ranges "]"]suffix; ranges = a[-b](,a[-b])*.
  // The first host is the prefix followed by the first number of the first range.
  size_t i = 0;
  std::string host;
  while (i < nodelist.size() && nodelist[i] != ',' && nodelist[i] != '[') host += nodelist[i++];
  if (i < nodelist.size() && nodelist[i] == '[') {
    size_t close = nodelist.find(']', i);
    if (close == std::string::npos) {
      throw std::invalid_argument("SLURM_JOB_NODELIST='" + nodelist + "' has an unclosed '['");
    }
    std::string first = nodelist.substr(i + 1, close - i - 1);
    first = first.substr(0, first.find_first_of(",-"));
    if (first.empty()) {
      throw std::invalid_argument("SLURM_JOB_NODELIST='" + nodelist + "' has an empty range");
    }
    host += first;
    // Text after ']' up to the next ',' belongs to the same host name.
    size_t j = close + 1;
    while (j < nodelist.size() && nodelist[j] != ',') host += nodelist[j++];
  }
  if (host.empty()) throw std::invalid_argument("SLURM_JOB_NODELIST is empty");
  return host;
}

RendezvousInfo rendezvous_from_env(const EnvLookup& env, int default_slurm_port) {
  RendezvousInfo info;
  const bool torchrun_like = env("RANK").has_value() && env("WORLD_SIZE").has_value();
  const bool slurm = env("SLURM_PROCID").has_value() && env("SLURM_NTASKS").has_value();

  if (torchrun_like) {
    info.source = truthy(env("LOOM_LOCAL_LAUNCHER")) ? RendezvousSource::kLocalLauncher
                                                     : RendezvousSource::kTorchrun;
    info.world_size = parse_int(env, "WORLD_SIZE", 1, kMaxRanks);
    info.rank = parse_int(env, "RANK", 0, info.world_size - 1);
    info.local_world_size = parse_int_or(env, "LOCAL_WORLD_SIZE", info.world_size, 1, kMaxRanks);
    info.local_rank = parse_int_or(env, "LOCAL_RANK", 0, 0, info.local_world_size - 1);
    auto addr = env("MASTER_ADDR");
    if (!addr || addr->empty()) {
      throw std::invalid_argument("environment variable MASTER_ADDR is not set (RANK and "
                                  "WORLD_SIZE are: a torchrun-style launch needs all of them)");
    }
    info.master_addr = *addr;
    info.master_port = parse_int(env, "MASTER_PORT", 1, 65535);
    info.use_agent_store = truthy(env("TORCHELASTIC_USE_AGENT_STORE"));
    if (info.use_agent_store) {
      int attempt = parse_int_or(env, "TORCHELASTIC_RESTART_COUNT", 0, 0, 1 << 30);
      info.store_prefix = "/worker/attempt_" + std::to_string(attempt);
    }
    return info;
  }
  if (slurm) {
    info.source = RendezvousSource::kSlurm;
    info.world_size = parse_int(env, "SLURM_NTASKS", 1, kMaxRanks);
    info.rank = parse_int(env, "SLURM_PROCID", 0, info.world_size - 1);
    info.local_rank = parse_int_or(env, "SLURM_LOCALID", 0, 0, kMaxRanks);
    if (auto per_node = env("SLURM_NTASKS_PER_NODE")) {
      info.local_world_size = parse_int(env, "SLURM_NTASKS_PER_NODE", 1, kMaxRanks);
    } else if (auto tasks = env("SLURM_TASKS_PER_NODE")) {
      // Forms: "4", "4(x2)", "4(x2),3": the first count is this job's usual tasks per node.
      try {
        info.local_world_size = std::stoi(*tasks);
      } catch (const std::exception&) {
        throw std::invalid_argument("environment variable SLURM_TASKS_PER_NODE='" + *tasks +
                                    "' does not start with a task count");
      }
    } else {
      info.local_world_size = info.world_size;
    }
    if (info.local_rank >= info.local_world_size) {
      throw std::invalid_argument("SLURM_LOCALID=" + std::to_string(info.local_rank) +
                                  " is not below the tasks per node (" +
                                  std::to_string(info.local_world_size) + ")");
    }
    if (auto addr = env("MASTER_ADDR"); addr && !addr->empty()) {
      info.master_addr = *addr;
    } else if (auto nodes = env("SLURM_JOB_NODELIST"); nodes && !nodes->empty()) {
      info.master_addr = first_slurm_host(*nodes);
    } else {
      throw std::invalid_argument(
          "under Slurm, set MASTER_ADDR or SLURM_JOB_NODELIST to find the rank-0 host");
    }
    if (env("MASTER_PORT")) {
      info.master_port = parse_int(env, "MASTER_PORT", 1, 65535);
    } else {
      int job = parse_int_or(env, "SLURM_JOB_ID", 0, 0, 2147483647);
      info.master_port = default_slurm_port + job % 1000;
    }
    return info;
  }
  info.source = RendezvousSource::kSingleProcess;
  return info;
}

}  // namespace loom::launch
