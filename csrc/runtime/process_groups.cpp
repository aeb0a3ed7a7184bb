#include "runtime/process_groups.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef LOOM_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <cstdlib>
#include <map>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <stdexcept>

#include "runtime/device_plugin.h"

namespace loom::runtime {

struct ProcessGroups::StoreHolder {
  c10::intrusive_ptr<c10d::Store> store;
};

namespace {

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// The store has no authentication: it listens on the address the ranks were told to use
// (MASTER_ADDR) rather than on every interface, so a run whose ranks meet on loopback cannot
// be reached from another host (docs/design/hardening.md, "Network exposure"). Returns a
// listening socket for TCPStore to take over, or -1 when MASTER_ADDR is not an address of
// this host (behind NAT, say): then the store listens on all interfaces, as torch's does.
int listen_on_master_address(const launch::RendezvousInfo& info) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(info.master_port);
  if (getaddrinfo(info.master_addr.c_str(), port.c_str(), &hints, &found) != 0 || !found) return -1;
  int fd = -1, last_error = 0;
  for (addrinfo* a = found; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      last_error = errno;
      ::close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0 && last_error == EADDRINUSE) {
    throw std::runtime_error("rendezvous at " + info.master_addr + ":" + port + ": the port is in use (set MASTER_PORT to a free one)");
  }
  return fd;
}

c10::intrusive_ptr<c10d::Store> connect_store(const launch::RendezvousInfo& info,
                                              std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(info.master_port);
  opts.isServer = info.is_store_server();
  if (opts.isServer) {
    const int fd = listen_on_master_address(info);
    if (fd >= 0) {
      opts.masterListenFd = fd;
    } else if (is_loopback(info.master_addr)) {
      throw std::runtime_error("rendezvous at " + info.master_addr + ":" + std::to_string(info.master_port) +
                               ": cannot listen on the loopback address");
    } else {
      std::fprintf(stderr, "[loom] warning: MASTER_ADDR %s is not an address of this host: the rendezvous store "
                           "listens on all interfaces (port %d)\n", info.master_addr.c_str(), info.master_port);
    }
  }
  opts.numWorkers = info.use_agent_store ? std::nullopt
                                         : std::optional<std::size_t>(info.world_size);
  opts.waitWorkers = !info.use_agent_store;
  opts.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(info.master_addr, opts);
  } catch (const std::exception& e) {
    throw std::runtime_error("rendezvous at " + info.master_addr + ":" +
                             std::to_string(info.master_port) + " failed for rank " +
                             std::to_string(info.rank) + " of " + std::to_string(info.world_size) +
                             ": " + e.what());
  }
  if (!info.store_prefix.empty()) {
    store = c10::make_intrusive<c10d::PrefixStore>(info.store_prefix, store);
  }
  return store;
}

// Hands an intrusive_ptr's reference to a shared_ptr that releases it.
std::shared_ptr<c10d::Backend> to_shared(c10::intrusive_ptr<c10d::Backend> backend) {
  c10d::Backend* raw = backend.release();
  return std::shared_ptr<c10d::Backend>(raw, [](c10d::Backend* b) {
    c10::intrusive_ptr<c10d::Backend>::reclaim(b);
  });
}

c10::intrusive_ptr<c10d::Backend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store,
                                            int group_rank, int group_size,
                                            std::chrono::milliseconds timeout, const std::string& master_addr) {
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  // Ranks that meet on loopback talk over loopback (Gloo's pairs then listen there only);
  // other hosts use the interfaces GLOO_SOCKET_IFNAME names (comma-separated, as torch's
  // Python front end reads it: LibTorch leaves that variable to its callers), else the address
  // of this host's name.
  const char* ifnames = std::getenv("GLOO_SOCKET_IFNAME");
  if (is_loopback(master_addr)) {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  } else if (ifnames && *ifnames) {
    std::string list = ifnames;
    for (size_t start = 0; start <= list.size();) {
      const size_t comma = std::min(list.find(',', start), list.size());
      if (comma > start) opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(list.substr(start, comma - start)));
      start = comma + 1;
    }
  } else {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  opts->threads = 2;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, group_rank, group_size, opts);
}

// The backend of one group of `options.device`'s kind (host-staged device groups use Gloo).
std::shared_ptr<c10d::Backend> make_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                            const std::string& prefix, int group_rank,
                                            int group_size, const ProcessGroupOptions& options,
                                            const std::string& master_addr) {
  auto group_store = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
  const RunDevice& d = options.device;
  switch (d.host_staged ? Collectives::kGloo : d.collectives) {
    case Collectives::kGloo:
      return to_shared(make_gloo(group_store, group_rank, group_size, options.timeout, master_addr));
    case Collectives::kPlugin: {
      const DevicePlugin* plugin = device_plugin();
      if (!plugin) throw std::logic_error("plugin collectives without LOOM_DEVICE_PLUGIN");
      c10d::Backend* raw = plugin->make_backend(group_store.get(), group_rank, group_size,
                                                options.timeout.count(), d.device.index());
      if (!raw) throw std::runtime_error(plugin->path + ": make_backend returned no backend");
      return to_shared(c10::intrusive_ptr<c10d::Backend>::reclaim(raw));
    }
    case Collectives::kNccl: {
#ifdef LOOM_HAVE_NCCL
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = options.timeout;
      auto backend =
          c10::make_intrusive<c10d::ProcessGroupNCCL>(group_store, group_rank, group_size, opts);
      // Bind the communicator to this rank's GPU and create it now (all members are building
      // this group at this point), so that a bad device or network fails here, not mid-step.
      backend->setBoundDeviceId(d.device);
      backend->eagerConnectSingleDevice(d.device);
      return to_shared(backend);
#else
      throw std::runtime_error("this build of Loom has no NCCL support (built without CUDA)");
#endif
    }
  }
  throw std::logic_error("unknown collectives kind");
}

}  // namespace

ProcessGroups::ProcessGroups(ParallelLayout layout, int rank, c10::Device device)
    : layout_(std::move(layout)), rank_(rank), device_(device) {}

ProcessGroups::~ProcessGroups() {
  try {
    shutdown();
  } catch (...) {
  }
}

std::shared_ptr<ProcessGroups> ProcessGroups::single_process(c10::Device device) {
  auto groups =
      std::shared_ptr<ProcessGroups>(new ProcessGroups(ParallelLayout(1, 1, 1), 0, device));
  groups->world_ = groups->tensor_ = groups->data_ = groups->pipeline_ =
      groups->model_parallel_ = groups->embedding_ = Communicator::solo(0, device);
  groups->links_ = std::make_unique<PipelineLinks>(PipelineLinks::single());
  groups->host_world_ = device.is_cpu() ? groups->world_ : Communicator::solo(0, c10::kCPU);
  return groups;
}

std::shared_ptr<ProcessGroups> ProcessGroups::create(const launch::RendezvousInfo& info,
                                                     const ProcessGroupOptions& options) {
  ParallelLayout layout(info.world_size, options.layout.tp, options.layout.pp);
  const c10::Device device = options.device.device;
  const char* real_solo_env = std::getenv("LOOM_SINGLE_RANK_GROUPS");
  const bool real_solo =
      options.single_rank_backends || (real_solo_env && std::string(real_solo_env) == "1");
  if (info.world_size == 1 && !real_solo) return single_process(device);
  auto groups = std::shared_ptr<ProcessGroups>(new ProcessGroups(layout, info.rank, device));
  groups->store_ = std::make_shared<StoreHolder>();
  groups->store_->store = connect_store(info, options.timeout);
  const auto& store = groups->store_->store;

  // Every rank builds only the groups it belongs to; a group's key prefix is its kind and
  // its lowest member, so members agree on it without talking.
  auto build = [&](const std::string& kind, const std::vector<int>& members) -> CommunicatorPtr {
    int group_rank = -1;
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i] == info.rank) group_rank = static_cast<int>(i);
    }
    if (group_rank < 0) throw std::logic_error("rank not in its own " + kind + " group");
    std::string name = kind + "[" + std::to_string(members.front()) + "]";
    if (members.size() == 1 && !real_solo) return Communicator::solo(info.rank, device);
    auto backend = make_backend(store, "loom/" + name + "/", group_rank,
                                static_cast<int>(members.size()), options, info.master_addr);
    return std::make_shared<Communicator>(std::move(backend), members, name, device,
                                          options.device.host_staged);
  };
  std::vector<int> everyone(info.world_size);
  for (int r = 0; r < info.world_size; ++r) everyone[r] = r;
  groups->world_ = build("world", everyone);
  groups->tensor_ = build("tensor", layout.tensor_group(info.rank));
  groups->data_ = build("data", layout.data_group(info.rank));
  groups->pipeline_ = build("pipeline", layout.pipeline_group(info.rank));
  // One two-member communicator per direction between neighbouring stages (pipeline_links.h),
  // built pair by pair in stage order on every rank (each pair's members build it together).
  {
    const auto stages = layout.pipeline_group(info.rank);  // world rank of each stage
    const int p = static_cast<int>(stages.size());
    const int me = groups->coords().pp;
    std::map<std::pair<int, int>, CommunicatorPtr> links;
    for (int a = 0; a + 1 < p || (p > 2 && a + 1 == p); ++a) {
      const int b = (a + 1) % p;
      if (me != a && me != b) continue;
      for (auto [from, to] : {std::pair{a, b}, std::pair{b, a}}) {
        std::vector<int> members{stages[from], stages[to]};
        std::sort(members.begin(), members.end());
        links[{from, to}] = build("pipe_link_" + std::to_string(stages[from]) + "_to_" +
                                      std::to_string(stages[to]),
                                  members);
      }
    }
    groups->links_ = std::make_unique<PipelineLinks>(me, p, std::move(links));
  }
  groups->model_parallel_ = build("model_parallel", layout.model_parallel_group(info.rank));
  auto embedding = layout.embedding_group(info.rank);
  bool on_end_stage = std::find(embedding.begin(), embedding.end(), info.rank) != embedding.end();
  groups->embedding_ =
      on_end_stage ? build("embedding", embedding) : Communicator::solo(info.rank, device);
  if (device.is_cpu()) {
    groups->host_world_ = groups->world_;
  } else {
    auto gloo = make_gloo(c10::make_intrusive<c10d::PrefixStore>("loom/host_world/", store),
                          info.rank, info.world_size, options.timeout, info.master_addr);
    groups->host_world_ =
        std::make_shared<Communicator>(to_shared(gloo), everyone, "host_world", c10::kCPU);
  }
  return groups;
}

void ProcessGroups::shutdown() {
  for (auto* c : {&embedding_, &model_parallel_, &pipeline_, &data_, &tensor_, &world_,
                  &host_world_}) {
    if (*c) (*c)->shutdown();
  }
  // The store goes last: rank 0 hosts it and peers may still be reading keys until their own
  // groups are connected, so callers that need it should barrier on world() before shutdown().
  store_.reset();
}

}  // namespace loom::runtime
