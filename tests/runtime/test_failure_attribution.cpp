// The failure the launcher names is the one that happened (launch/failure_report.h): a rank
// killed from outside, or the rank whose own error came first, before the peers that only lost
// it and the ranks the launcher stopped.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "harness/multiprocess.h"
#include "launch/env_rendezvous.h"
#include "launch/failure_report.h"
#include "launch/local_launcher.h"
#include "runtime/process_groups.h"

using namespace loom;
using launch::RankOutcome;

namespace {

RankOutcome outcome(int rank, int exit_code, double exit_s) {
  RankOutcome o;
  o.rank = rank;
  o.exit_code = exit_code;
  o.exit_s = exit_s;
  return o;
}

RankOutcome killed(int rank, int signal, double exit_s, bool by_launcher = false) {
  RankOutcome o = outcome(rank, 128 + signal, exit_s);
  o.signal = signal;
  o.signal_sent_by_launcher = by_launcher;
  return o;
}

RankOutcome errored(int rank, double error_s, const std::string& error, double exit_s) {
  RankOutcome o = outcome(rank, 1, exit_s);
  o.error_s = error_s;
  o.error = error;
  return o;
}

}  // namespace

TEST_CASE("a rank killed from outside is named before the peers that lost it", "[launch][failures]") {
  // The survivors noticed the closed sockets and recorded their errors before the launcher
  // even reaped the dead rank: time alone would blame them.
  std::vector<RankOutcome> o = {
      errored(0, 1.001, "collective all_reduce failed: Connection closed by peer [127.0.0.1]:4242", 1.002),
      killed(1, SIGKILL, 1.050),
      errored(2, 1.001, "Connection reset by peer", 1.003),
      killed(3, SIGTERM, 1.100, /*by_launcher=*/true)};
  o[3].stop_s = 1.06;
  REQUIRE(launch::primary_failure(o) == 1);
  const std::string text = launch::describe_failures(o, 1);
  CHECK(text ==
        "rank 1 failed first (killed by signal 9, SIGKILL), with no error message\n"
        "then, as a consequence: rank 0 (exit 1): collective all_reduce failed: Connection closed by peer "
        "[127.0.0.1]:4242; rank 2 (exit 1): Connection reset by peer\n"
        "stopped by the launcher: rank 3");
}

TEST_CASE("a rank's own error beats earlier peer-loss errors and the ranks stopped after it", "[launch][failures]") {
  std::vector<RankOutcome> o = {errored(0, 2.0, "Connection closed by peer", 2.1),
                                errored(1, 2.3, "checkpoint shard x is corrupt: its content hash differs", 2.4),
                                killed(2, SIGTERM, 2.6, true)};
  o[2].stop_s = 2.5;
  CHECK(launch::primary_failure(o) == 1);
  // A rank that says it stopped because of another is a consequence even without a pattern.
  o[1].error_is_consequence = true;
  o[0].error = "no such file";
  CHECK(launch::primary_failure(o) == 0);
  // Among failures of the same kind, the earliest.
  std::vector<RankOutcome> two = {errored(0, 3.0, "bad input", 3.1), errored(1, 2.0, "bad input", 3.2)};
  CHECK(launch::primary_failure(two) == 1);
  CHECK(launch::primary_failure({outcome(0, 0, 1), outcome(1, 0, 1)}) == -1);
}

TEST_CASE("a rank stopped by the launcher while exiting after its own error is not called killed",
          "[launch][failures]") {
  // Both ranks learn of a corrupt shard at once; rank 0 (the consequence) exits first and the
  // launcher's SIGTERM reaches rank 1 while it is still exiting with its own error.
  std::vector<RankOutcome> o = {errored(0, 2.0, "another rank (rank 1) could not load checkpoint iter_0000002", 2.1),
                                killed(1, SIGTERM, 2.3, /*by_launcher=*/true)};
  o[0].error_is_consequence = true;
  o[0].exit_code = 2;
  o[1].error_s = 2.0;
  o[1].error = "checkpoint shard x is corrupt";
  o[1].stop_s = 2.15;
  REQUIRE(launch::primary_failure(o) == 1);
  CHECK(launch::describe_failures(o, 1) ==
        "rank 1 failed first (stopped by the launcher's SIGTERM after its error):\n"
        "checkpoint shard x is corrupt\n"
        "then, as a consequence: rank 0 (exit 2): another rank (rank 1) could not load checkpoint iter_0000002");
}

TEST_CASE("a rank's first recorded error is kept", "[launch][failures]") {
  char dir[] = "/tmp/loom_error_file_XXXXXX";
  REQUIRE(mkdtemp(dir));
  const std::string file = std::string(dir) + "/rank.err";
  ::setenv("LOOM_ERROR_FILE", file.c_str(), 1);
  launch::record_rank_error("the real error");
  launch::record_rank_error("a later error while unwinding", /*consequence=*/true);
  ::unsetenv("LOOM_ERROR_FILE");
  std::ifstream in(file);
  std::string stamp, message;
  std::getline(in, stamp);
  std::getline(in, message);
  CHECK(message == "the real error");
  CHECK(stamp.find("consequence") == std::string::npos);
  std::remove(file.c_str());
  rmdir(dir);
}

LOOM_WORKER("one_rank_killed_by_sigkill") {
  at::set_num_threads(1);
  runtime::ProcessGroupOptions opt;
  opt.timeout = std::chrono::milliseconds(20000);
  auto g = runtime::ProcessGroups::create(launch::rendezvous_from_env(), opt);
  g->world().barrier();
  if (g->rank() == 1) ::raise(SIGKILL);  // what `kill -9` or the OOM killer does
  at::Tensor x = at::ones({4});
  g->world().all_reduce(x);  // the survivors fail here: "Connection closed by peer"
}

TEST_CASE("the launcher names the rank killed by SIGKILL, not a survivor", "[launch][failures][multiprocess]") {
  // The survivors fail by themselves (their errors recorded before the dead rank is reaped:
  // the case that was blamed on them), then with the launcher stopping them.
  for (const bool stop_all : {false, true}) {
    auto r = test::run_ranks("one_rank_killed_by_sigkill", 3, {}, 60.0, stop_all);
    INFO(r.summary());
    CHECK(r.first_failed_rank == 1);
    CHECK_THAT(r.summary(), Catch::StartsWith("rank 1 failed first (killed by signal 9, SIGKILL)"));
    if (!stop_all) CHECK_THAT(r.summary(), Catch::Contains("then, as a consequence: rank 0 (exit 1)"));
  }
}
