// Real c10d groups over Gloo on loopback: membership on every rank, exact collective results,
// and ranks that die or hang make their peers fail instead of waiting forever.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <chrono>
#include <thread>

#include "harness/multiprocess.h"
#include "launch/env_rendezvous.h"
#include "runtime/process_groups.h"

using namespace loom;
using runtime::Communicator;
using runtime::ProcessGroupOptions;
using runtime::ProcessGroups;

namespace {

std::shared_ptr<ProcessGroups> make_groups(int timeout_ms = 30000) {
  at::set_num_threads(1);
  ProcessGroupOptions opt;
  opt.layout.tp = test::env_int("T");
  opt.layout.pp = test::env_int("P");
  opt.timeout = std::chrono::milliseconds(timeout_ms);
  return ProcessGroups::create(launch::rendezvous_from_env(), opt);
}

// Members computed straight from global_rank = tp + t·(dp + d·pp), independent of the library.
std::vector<int> expected_members(const std::string& kind, int rank, int world, int t, int p) {
  int d = world / (t * p);
  int tp = rank % t, dp = (rank / t) % d, pp = rank / (t * d);
  std::vector<int> m;
  for (int r = 0; r < world; ++r) {
    int rtp = r % t, rdp = (r / t) % d, rpp = r / (t * d);
    if ((kind == "tensor" && rdp == dp && rpp == pp) || (kind == "data" && rtp == tp && rpp == pp) ||
        (kind == "pipeline" && rtp == tp && rdp == dp) || (kind == "model" && rdp == dp)) {
      m.push_back(r);
    }
  }
  return m;
}

// The group really connects its members: the sum of their world ranks comes back.
void check_group(Communicator& c, const std::vector<int>& expected, int rank) {
  LOOM_WCHECK(c.ranks() == expected, "(group " + c.name() + ")");
  LOOM_WCHECK(c.ranks()[c.rank()] == rank);
  at::Tensor v = at::full({3}, double(rank), at::kDouble);
  c.all_reduce(v);
  double sum = 0;
  for (int r : expected) sum += r;
  LOOM_WCHECK(v.eq(sum).all().item<bool>(), "(all_reduce on " + c.name() + ")");
}

}  // namespace

LOOM_WORKER("group_membership") {
  auto g = make_groups();
  const int rank = g->rank(), world = g->layout().world_size();
  const int t = test::env_int("T"), p = test::env_int("P");
  check_group(g->tensor(), expected_members("tensor", rank, world, t, p), rank);
  check_group(g->data(), expected_members("data", rank, world, t, p), rank);
  check_group(g->pipeline(), expected_members("pipeline", rank, world, t, p), rank);
  check_group(g->model_parallel(), expected_members("model", rank, world, t, p), rank);
  auto pipe = expected_members("pipeline", rank, world, t, p);
  if (rank == pipe.front() || rank == pipe.back()) {
    std::vector<int> emb = pipe.size() == 1 ? pipe : std::vector<int>{pipe.front(), pipe.back()};
    check_group(g->embedding(), emb, rank);
  } else {
    LOOM_WCHECK(g->embedding().size() == 1);
  }
  g->world().barrier();
  g->shutdown();
}

TEST_CASE("group membership for world 8 on every rank", "[runtime][multiprocess]") {
  for (auto [t, p] : {std::pair{2, 2}, {4, 1}, {1, 4}, {2, 1}}) {
    INFO("t=" << t << " p=" << p);
    auto r = test::run_ranks("group_membership", 8, {{"T", std::to_string(t)}, {"P", std::to_string(p)}});
    REQUIRE(r.exit_code() == 0);
  }
}

LOOM_WORKER("collectives") {
  auto g = make_groups();
  const int rank = g->rank();
  // World all-reduce, SUM and MAX, on rank-dependent values.
  at::Tensor x = at::arange(6, at::kLong).add(100 * rank);
  g->world().all_reduce(x);
  LOOM_WCHECK(at::equal(x, at::arange(6, at::kLong).mul(4).add(100 * (0 + 1 + 2 + 3))));
  at::Tensor m = at::full({2}, double(rank * rank), at::kDouble);
  g->world().all_reduce(m, runtime::ReduceOp::kMax);
  LOOM_WCHECK(m.eq(9.0).all().item<bool>());
  // Tensor group (t=2): all-gather and reduce-scatter along dim 0.
  auto& tp = g->tensor();
  at::Tensor shard = at::full({2, 3}, double(rank), at::kFloat);
  at::Tensor gathered = tp.all_gather_dim0(shard);
  LOOM_WCHECK(gathered.size(0) == 4);
  for (int i = 0; i < 2; ++i) {
    LOOM_WCHECK(gathered.slice(0, 2 * i, 2 * i + 2).eq(float(tp.ranks()[i])).all().item<bool>());
  }
  // Row j of member r holds 10·r + j; after reduce-scatter, member q holds rows of its slice.
  at::Tensor full = at::arange(4, at::kFloat).unsqueeze(1).repeat({1, 5}).add(10.0f * rank);
  at::Tensor mine = tp.reduce_scatter_dim0(full);
  LOOM_WCHECK(mine.size(0) == 2 && mine.size(1) == 5);
  float member_sum = 10.0f * (tp.ranks()[0] + tp.ranks()[1]);
  for (int j = 0; j < 2; ++j) {
    float want = member_sum + 2.0f * (2 * tp.rank() + j);
    LOOM_WCHECK(mine[j].eq(want).all().item<bool>(), "row " + std::to_string(j));
  }
  // Broadcast from group rank 1 of the pipeline group.
  at::Tensor b = at::full({4}, double(rank), at::kDouble);
  g->pipeline().broadcast(b, 1);
  LOOM_WCHECK(b.eq(double(g->pipeline().ranks()[1])).all().item<bool>());
  // Send/recv between pipeline neighbours: stage 0 → 1 activations, 1 → 0 gradients.
  auto& pp = g->pipeline();
  if (pp.rank() == 0) {
    at::Tensor act = at::arange(8, at::kFloat).add(1000 * rank).contiguous();
    pp.send(act, 1, 7);
    at::Tensor grad = at::empty({8}, at::kFloat);
    pp.recv(grad, 1, 8);
    LOOM_WCHECK(at::equal(grad, at::arange(8, at::kFloat).neg().sub(1000 * pp.ranks()[1])));
  } else {
    at::Tensor act = at::empty({8}, at::kFloat);
    pp.recv(act, 0, 7);
    LOOM_WCHECK(at::equal(act, at::arange(8, at::kFloat).add(1000 * pp.ranks()[0])));
    at::Tensor grad = at::arange(8, at::kFloat).neg().sub(1000 * rank).contiguous();
    pp.send(grad, 0, 8);
  }
  // Reduce-scatter with a dim 0 that does not divide: a clear error, no collective issued.
  bool threw = false;
  try {
    tp.reduce_scatter_dim0(at::zeros({3}));
  } catch (const std::invalid_argument& e) {
    threw = std::string(e.what()).find("not divisible") != std::string::npos;
  }
  LOOM_WCHECK(threw);
  g->world().barrier();
  g->shutdown();
}

TEST_CASE("collectives give exact rank-dependent results", "[runtime][multiprocess]") {
  auto r = test::run_ranks("collectives", 4, {{"T", "2"}, {"P", "2"}});
  REQUIRE(r.exit_code() == 0);
}

LOOM_WORKER("one_rank_throws") {
  auto g = make_groups(/*timeout_ms=*/4000);
  g->world().barrier();
  if (g->rank() == 1) throw std::runtime_error("rank 1 fails on purpose");
  at::Tensor x = at::ones({4});
  g->world().all_reduce(x);  // must throw: rank 1 never joins and its sockets close
}

LOOM_WORKER("one_rank_hangs") {
  auto g = make_groups(/*timeout_ms=*/2000);
  g->world().barrier();
  if (g->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(8));  // alive but silent
    return;
  }
  at::Tensor x = at::ones({4});
  g->world().all_reduce(x);  // must time out
}

TEST_CASE("a rank that throws mid-collective: the others exit non-zero by themselves",
          "[runtime][multiprocess]") {
  auto r = test::run_ranks("one_rank_throws", 3, {{"T", "1"}, {"P", "1"}}, 60.0,
                           /*stop_all_on_failure=*/false);
  REQUIRE(r.ranks.size() == 3);
  CHECK(r.first_failed_rank == 1);
  CHECK_THAT(r.first_error, Catch::Contains("rank 1 fails on purpose"));
  for (const auto& rank : r.ranks) {
    INFO("rank " << rank.rank << " exit " << rank.exit_code << " after " << rank.seconds << " s");
    CHECK(rank.exit_code != 0);
    CHECK_FALSE(rank.signaled);      // they exited by themselves, not killed by the launcher
    CHECK(rank.seconds < 4.0 + 20);  // within the collective timeout (plus process start-up)
  }
}

TEST_CASE("a rank that hangs: the others time out and exit non-zero", "[runtime][multiprocess]") {
  auto r = test::run_ranks("one_rank_hangs", 3, {{"T", "1"}, {"P", "1"}}, 60.0,
                           /*stop_all_on_failure=*/false);
  REQUIRE(r.ranks.size() == 3);
  for (int i : {0, 2}) {
    const auto& rank = r.ranks[i];
    INFO("rank " << i << " output: " << rank.output);
    CHECK(rank.exit_code == 1);
    CHECK_THAT(rank.output, Catch::Contains("all_reduce") && Catch::Contains("failed"));
    CHECK(rank.seconds < r.ranks[1].seconds);  // before the silent rank even finished
  }
}

TEST_CASE("one rank gets real groups when asked (the GPU bring-up's NCCL check)", "[runtime]") {
  launch::RendezvousInfo info;  // a single process: rank 0 of 1, loopback, any free port
  ProcessGroupOptions opt;
  opt.single_rank_backends = true;
  opt.timeout = std::chrono::seconds(20);
  auto g = ProcessGroups::create(info, opt);
  CHECK(g->world().name() == "world[0]");  // a c10d backend, not the solo shortcut
  CHECK(g->tensor().name() == "tensor[0]");
  at::Tensor x = at::full({3}, 2.0);
  g->data().all_reduce(x);
  CHECK(x.eq(2.0).all().item<bool>());
  CHECK(g->data().all_gather_dim0(x).size(0) == 3);
  g->world().barrier();
  g->shutdown();
  CHECK(ProcessGroups::create(info, ProcessGroupOptions{})->world().name() == "solo");
}
