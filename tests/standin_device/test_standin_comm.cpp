// The stand-in communicator in 2-4 forked processes (one standin device per rank) over a
// TCPStore on a loopback port: its results against a plain ProcessGroupGloo on CPU tensors,
// its NCCL-like refusals, Gloo's errors through wait(). Children report through exit status.
#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "test_common.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

using standin_test::contains;
using standin_test::error_of;
using standin_test::plugin;
using standin_test::same_bits;
using standin_test::standin;

namespace {

using BackendPtr = c10::intrusive_ptr<c10d::Backend>;
using StorePtr = c10::intrusive_ptr<c10d::Store>;

struct ChildFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

#define EXPECT(cond, what)                                                               \
  do {                                                                                   \
    if (!(cond)) throw ChildFailure(std::string(what) + " (" #cond ", line " +          \
                                    std::to_string(__LINE__) + ")");                     \
  } while (0)

// Forks `world` children running body(rank, store) and returns their exit statuses (0 =
// passed). Rank 0 serves the TCPStore on a free loopback port and hands the port to the others
// through a pipe; the parent starts no thread before forking (a lock held by another thread at
// fork time would stay locked in the child). A child still running after `limit` is killed and
// counted as failed (status 124), so the test cannot hang.
std::vector<int> run_ranks(int world, const std::function<void(int, const StorePtr&)>& body,
                           std::chrono::seconds limit = std::chrono::seconds(60)) {
  plugin();   // load before forking: every child inherits the registered device
  int port_pipe[2];
  if (pipe(port_pipe) != 0) throw std::runtime_error("pipe failed");
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      int status = 0;
      StorePtr store;
      try {
        at::set_num_threads(1);   // no OpenMP team in a forked child
        c10d::TCPStoreOptions o;
        o.isServer = rank == 0;
        o.waitWorkers = false;
        o.timeout = std::chrono::seconds(30);
        uint16_t port = 0;
        if (rank == 0) {
          o.port = 0;
          store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
          port = static_cast<c10d::TCPStore&>(*store).getPort();
          for (int r = 1; r < world; ++r) {
            if (write(port_pipe[1], &port, sizeof(port)) != sizeof(port)) {
              throw std::runtime_error("writing the store port failed");
            }
          }
        } else {
          if (read(port_pipe[0], &port, sizeof(port)) != sizeof(port)) {
            throw std::runtime_error("reading the store port failed");
          }
          o.port = port;
          store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
        }
        body(rank, store);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d failed: %s\n", rank, e.what());
        status = 1;
      }
      try {   // rank 0 serves the store: it leaves last
        if (store) {
          store->add("standin_test/exited", 1);
          if (rank == 0) {
            const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
            while (store->add("standin_test/exited", 0) < world &&
                   std::chrono::steady_clock::now() < until) {
              std::this_thread::sleep_for(std::chrono::milliseconds(5));
            }
          }
        }
      } catch (const std::exception&) {
      }
      std::fflush(stderr);
      _exit(status);   // no static destructors in the child
    }
    pids.push_back(pid);
  }
  close(port_pipe[0]);
  close(port_pipe[1]);
  std::vector<int> statuses(world, -1);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int left = world;
  while (left > 0) {
    for (int r = 0; r < world; ++r) {
      if (statuses[r] != -1) continue;
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        statuses[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < world; ++r) {
        if (statuses[r] != -1) continue;
        kill(pids[r], SIGKILL);
        waitpid(pids[r], nullptr, 0);
        statuses[r] = 124;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return statuses;
}

BackendPtr make_standin(const StorePtr& store, int rank, int world, int device,
                        int64_t timeout_ms = 30000) {
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("standin/", store);
  c10d::Backend* raw = plugin().make_backend(prefixed.get(), rank, world, timeout_ms, device);
  return BackendPtr::reclaim(raw);
}

BackendPtr make_gloo(const StorePtr& store, int rank, int world) {
  auto opts = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(30));
  opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  return c10::make_intrusive<c10d::ProcessGroupGloo>(
      c10::make_intrusive<c10d::PrefixStore>("gloo/", store), rank, world, opts);
}

void wait(const c10::intrusive_ptr<c10d::Work>& w) { w->wait(); }

// The same collectives on standin tensors through the stand-in and on CPU tensors through Gloo.
void collectives(int rank, const StorePtr& store, int world) {
  const c10::Device dev = standin(rank);
  BackendPtr s = make_standin(store, rank, world, rank);
  BackendPtr g = make_gloo(store, rank, world);
  EXPECT(s->getBackendName() == "standin", "backend name");
  EXPECT(s->getBoundDeviceId() == std::optional<c10::Device>(dev), "bound device");
  at::Generator gen = at::detail::createCPUGenerator(100 + rank);
  auto both = [&](const at::Tensor& host) {
    return std::make_pair(host.to(dev), host.clone());
  };

  {   // all_reduce SUM (fp32) and MAX (int32), then bf16 SUM
    auto [d, h] = both(at::randn({5, 7}, gen));
    std::vector<at::Tensor> dv{d}, hv{h};
    wait(s->allreduce(dv));
    wait(g->allreduce(hv));
    EXPECT(d.device() == dev && same_bits(d, h), "all_reduce SUM");
    auto [di, hi] = both(at::randint(-50, 50, {9}, gen, at::kInt));
    std::vector<at::Tensor> div{di}, hiv{hi};
    c10d::AllreduceOptions mx;
    mx.reduceOp = c10d::ReduceOp::MAX;
    wait(s->allreduce(div, mx));
    wait(g->allreduce(hiv, mx));
    EXPECT(same_bits(di, hi), "all_reduce MAX");
    auto [db, hb] = both(at::randn({6}, gen).to(at::kBFloat16));
    std::vector<at::Tensor> dbv{db}, hbv{hb};
    wait(s->allreduce(dbv));
    wait(g->allreduce(hbv));
    EXPECT(same_bits(db, hb), "all_reduce bf16");
    // AVG (NCCL has it, Gloo not): the sum divided by the group size.
    auto [da, ha] = both(at::randn({4}, gen));
    std::vector<at::Tensor> dav{da}, hav{ha};
    c10d::AllreduceOptions avg;
    avg.reduceOp = c10d::ReduceOp::AVG;
    wait(s->allreduce(dav, avg));
    wait(g->allreduce(hav));
    EXPECT(same_bits(da, ha.div(world)), "all_reduce AVG");
  }
  {   // broadcast from rank 1
    auto [d, h] = both(at::randn({3, 4}, gen));
    std::vector<at::Tensor> dv{d}, hv{h};
    c10d::BroadcastOptions o;
    o.rootRank = 1;
    wait(s->broadcast(dv, o));
    wait(g->broadcast(hv, o));
    EXPECT(same_bits(d, h), "broadcast");
  }
  {   // all_gather into one tensor, and into a list
    auto [d, h] = both(at::randn({4}, gen));
    at::Tensor dout = at::empty({world * 4}, at::TensorOptions().device(dev));
    at::Tensor hout = at::empty({world * 4});
    wait(s->_allgather_base(dout, d));
    wait(g->_allgather_base(hout, h));
    EXPECT(dout.device() == dev && same_bits(dout, hout), "_allgather_base");
    std::vector<std::vector<at::Tensor>> dl(1), hl(1);
    for (int r = 0; r < world; ++r) {
      dl[0].push_back(at::empty({4}, at::TensorOptions().device(dev)));
      hl[0].push_back(at::empty({4}));
    }
    std::vector<at::Tensor> dv{d}, hv{h};
    wait(s->allgather(dl, dv));
    wait(g->allgather(hl, hv));
    for (int r = 0; r < world; ++r) EXPECT(same_bits(dl[0][r], hl[0][r]), "allgather");
  }
  {   // reduce_scatter from one tensor
    auto [d, h] = both(at::randn({world * 3}, gen));
    at::Tensor dout = at::empty({3}, at::TensorOptions().device(dev));
    at::Tensor hout = at::empty({3});
    wait(s->_reduce_scatter_base(dout, d));
    wait(g->_reduce_scatter_base(hout, h));
    EXPECT(same_bits(dout, hout), "_reduce_scatter_base");
  }
  {   // send / recv around a ring: even ranks send first, odd ranks receive first (the
      // stand-in's sends wait for their receive, as NCCL's do: all sending first would deadlock)
    auto [d, h] = both(at::randn({2, 5}, gen));
    const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    at::Tensor drecv = at::empty({2, 5}, at::TensorOptions().device(dev));
    at::Tensor hrecv = at::empty({2, 5});
    std::vector<at::Tensor> ds{d}, dr{drecv}, hs{h}, hr{hrecv};
    if (rank % 2 == 0) {
      auto w1 = s->send(ds, next, 7);
      auto w2 = s->recv(dr, prev, 7);
      wait(w1);
      wait(w2);
    } else {
      auto w2 = s->recv(dr, prev, 7);
      auto w1 = s->send(ds, next, 7);
      wait(w2);
      wait(w1);
    }
    auto w3 = g->send(hs, next, 7);
    auto w4 = g->recv(hr, prev, 7);
    wait(w3);
    wait(w4);
    EXPECT(same_bits(drecv, hrecv), "send/recv");
  }
  wait(s->barrier());

  // Refusals, named like NCCL would; every rank checks them locally (nothing is sent).
  std::vector<at::Tensor> host{at::ones({3})};
  std::string e = error_of([&] { s->allreduce(host); });
  EXPECT(contains(e, "standin communicator: all_reduce got a tensor on cpu, expected standin:" +
                         std::to_string(rank) +
                         " (NCCL takes tensors on the communicator's device only)"),
         "host tensor refused: " + e);
  std::vector<at::Tensor> other{at::ones({3}, at::TensorOptions().device(standin(rank + 5)))};
  e = error_of([&] { s->broadcast(other); });
  EXPECT(contains(e, "broadcast got a tensor on standin:" + std::to_string(rank + 5) +
                         ", expected standin:" + std::to_string(rank)),
         "other device refused: " + e);
  std::vector<at::Tensor> flags{at::ones({3}, at::TensorOptions().dtype(at::kBool).device(dev))};
  e = error_of([&] { s->allreduce(flags); });
  EXPECT(contains(e, "NCCL has no Bool type (send flags as uint8 or int32)"), "bool: " + e);
  std::vector<at::Tensor> cplx{
      at::ones({3}, at::TensorOptions().dtype(at::kComplexFloat).device(dev))};
  e = error_of([&] { s->allreduce(cplx); });
  EXPECT(contains(e, "NCCL has no ComplexFloat type"), "complex: " + e);
  std::vector<at::Tensor> strided{at::ones({4, 4}, at::TensorOptions().device(dev)).t()};
  e = error_of([&] { s->send(strided, (rank + 1) % world, 0); });
  EXPECT(contains(e, "send got a non-contiguous tensor"), "non-contiguous: " + e);
  c10d::AllreduceOptions band;
  band.reduceOp = c10d::ReduceOp::BAND;
  std::vector<at::Tensor> ints{at::ones({3}, at::TensorOptions().dtype(at::kInt).device(dev))};
  e = error_of([&] { s->allreduce(ints, band); });
  EXPECT(contains(e, "bitwise reduction"), "BAND: " + e);
  wait(s->barrier());
}

}  // namespace

TEST_CASE("standin comm: the factory is found by dlsym", "[standin][comm]") {
  const auto& p = plugin();
  void* again = dlopen(LOOM_STANDIN_LIBRARY, RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(again == p.handle);   // one copy of the library per process
  dlclose(again);
  CHECK(dlsym(p.handle, "loom_device_plugin_make_backend") ==
        reinterpret_cast<void*>(p.make_backend));
  CHECK(std::string(p.name()) == "standin");
  CHECK_FALSE(error_of([&] { p.make_backend(nullptr, 0, 1, 1000, 0); }).empty());
}

TEST_CASE("standin comm: collectives match Gloo on CPU tensors (2, 3 and 4 ranks)",
          "[standin][comm]") {
  for (int world : {2, 3, 4}) {
    INFO("world " << world);
    auto statuses = run_ranks(world, [world](int rank, const StorePtr& store) {
      collectives(rank, store, world);
    });
    for (int r = 0; r < world; ++r) {
      INFO("rank " << r << " exit status " << statuses[r] << " (details on stderr)");
      CHECK(statuses[r] == 0);
    }
  }
}

TEST_CASE("standin comm: two ranks on one device are refused", "[standin][comm]") {
  auto statuses = run_ranks(2, [](int rank, const StorePtr& store) {
    const std::string e = error_of([&] { make_standin(store, rank, 2, /*device=*/0); });
    EXPECT(contains(e, "both on standin:0") && contains(e, "Duplicate GPU detected"),
           "duplicate device: " + e);
  });
  CHECK((statuses == std::vector<int>{0, 0}));
}

TEST_CASE("standin comm: wait() rethrows Gloo's timeout", "[standin][comm]") {
  auto statuses = run_ranks(2, [](int rank, const StorePtr& store) {
    BackendPtr s = make_standin(store, rank, 2, rank, /*timeout_ms=*/1000);
    if (rank == 1) {   // a recv that no send matches
      std::vector<at::Tensor> t{at::empty({4}, at::TensorOptions().device(standin(1)))};
      auto work = s->recv(t, 0, 3);
      const auto start = std::chrono::steady_clock::now();
      const std::string e = error_of([&] { work->wait(); });
      const double s_waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT(!e.empty(), "recv without a send must fail");
      EXPECT(s_waited < 20.0, "the timeout must come from Gloo's 1 s timeout");
      store->set("rank1_done", std::string("1"));
    } else {
      store->wait({"rank1_done"});
    }
  });
  CHECK((statuses == std::vector<int>{0, 0}));
}
