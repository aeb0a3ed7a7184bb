// The commit of a checkpoint survives a kill at every step (train/checkpoint_files.h): a child
// process commits and is killed before step k; the next start finishes or rolls the commit
// back, the tracker names a complete iteration, and nothing committed is ever lost.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "launch/file_util.h"
#include "train/checkpoint_files.h"

using namespace loom::train;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/loom_commit_test_XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { loom::launch::remove_tree(path); }
};

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

/// A complete iteration folder `name` holding one shard with `content`, as a save writes it.
void make_folder(const std::string& dir, const std::string& name, int64_t iteration, const std::string& content) {
  const std::string folder = dir + "/" + name;
  ::mkdir(folder.c_str(), 0755);
  ::mkdir((folder + "/mp_rank_00").c_str(), 0755);
  write(folder + "/mp_rank_00/" + kShardFileName, content);
  const nlohmann::json meta = {
      {"format", "loom-megatron-legacy-1"},
      {"iteration", iteration},
      {"layout",
       {{"tensor_model_parallel_size", 1}, {"pipeline_model_parallel_size", 1},
        {"virtual_pipeline_model_parallel_size", 1}, {"data_parallel_size", 1}, {"model", {{"num_layers", 2}}}}},
      {"files",
       {{std::string("mp_rank_00/") + kShardFileName,
         {{"bytes", content.size()}, {"fnv1a64", fmt::format("{:016x}", fnv1a64(content.data(), content.size()))}}}}}};
  write(folder + "/metadata.json", meta.dump(2));
}

std::string shard_of(const std::string& dir, const std::string& folder) {
  return read(dir + "/" + folder + "/mp_rank_00/" + kShardFileName);
}

int64_t tracker(const std::string& dir) {
  return parse_tracker(read(dir + "/" + kTrackerFile), kTrackerFile);
}

/// Runs commit_checkpoint(dir, iteration) in a child that dies (SIGKILL) just before `kill_at`.
void commit_killed_before(const std::string& dir, int64_t iteration, CommitStep kill_at) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    try {
      commit_checkpoint(dir, iteration, [&](CommitStep s) {
        if (s == kill_at) ::raise(SIGKILL);
      });
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  REQUIRE((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));
}

const char* step_name(CommitStep s) {
  switch (s) {
    case CommitStep::kJournal: return "journal";
    case CommitStep::kSupersede: return "supersede";
    case CommitStep::kRename: return "rename";
    case CommitStep::kTracker: return "tracker";
    case CommitStep::kClearJournal: return "clear journal";
    case CommitStep::kDone: return "done";
  }
  return "?";
}

/// Folders of `dir` whose name contains `part`.
std::vector<std::string> folders_with(const std::string& dir, const std::string& part) {
  std::vector<std::string> out;
  for (const auto& name : loom::launch::list_directory(dir))
    if (name.find(part) != std::string::npos) out.push_back(name);
  return out;
}

}  // namespace

TEST_CASE("a commit killed at any step is finished or rolled back, never lost", "[train][checkpoint][faults]") {
  for (const bool existing : {false, true}) {
    for (CommitStep kill_at : {CommitStep::kJournal, CommitStep::kSupersede, CommitStep::kRename,
                               CommitStep::kTracker, CommitStep::kClearJournal, CommitStep::kDone}) {
      INFO("killed before step '" << step_name(kill_at) << "'" << (existing ? ", iter 4 saved by an earlier run" : ""));
      TempDir d;
      make_folder(d.path, iteration_dir_name(2), 2, "two");
      write(d.path + "/" + kTrackerFile, "2\n");
      if (existing) make_folder(d.path, iteration_dir_name(4), 4, "old four");
      make_folder(d.path, iteration_dir_name(4) + ".tmp", 4, "new four");

      commit_killed_before(d.path, 4, kill_at);
      const auto actions = recover_checkpoint_dir(d.path);

      const int64_t t = tracker(d.path);
      CHECK(incomplete_reason(d.path, t).empty());
      CHECK(folders_with(d.path, ".tmp").empty());
      CHECK(folders_with(d.path, kCommitJournal).empty());
      CHECK(shard_of(d.path, iteration_dir_name(2)) == "two");
      if (kill_at == CommitStep::kJournal) {
        // Before the journal the save had not committed: the previous checkpoint loads.
        CHECK(t == 2);
        if (existing) CHECK(shard_of(d.path, iteration_dir_name(4)) == "old four");
      } else {
        CHECK(t == 4);
        CHECK(shard_of(d.path, iteration_dir_name(4)) == "new four");
        if (existing) {
          const auto kept = folders_with(d.path, ".superseded-");
          REQUIRE(kept.size() == 1);
          CHECK(shard_of(d.path, kept[0]) == "old four");
        }
      }
      if (kill_at != CommitStep::kJournal && kill_at != CommitStep::kDone) CHECK(!actions.empty());
    }
  }
}

TEST_CASE("re-saving identical shards keeps one copy, a damaged copy is superseded", "[train][checkpoint]") {
  TempDir d;
  make_folder(d.path, iteration_dir_name(4), 4, "four");
  make_folder(d.path, iteration_dir_name(4) + ".tmp", 4, "four");
  CommitResult same = commit_checkpoint(d.path, 4);
  CHECK(same.same_as_existing);
  CHECK(folders_with(d.path, ".superseded-").empty());
  CHECK(tracker(d.path) == 4);

  // The earlier copy's metadata matches but a byte of its shard flipped: keep it aside, commit the new one.
  write(d.path + "/" + iteration_dir_name(4) + "/mp_rank_00/" + kShardFileName, "fouR");
  make_folder(d.path, iteration_dir_name(4) + ".tmp", 4, "four");
  CommitResult replaced = commit_checkpoint(d.path, 4);
  CHECK_FALSE(replaced.same_as_existing);
  CHECK(replaced.superseded_as == iteration_dir_name(4) + ".superseded-1");
  CHECK(shard_of(d.path, iteration_dir_name(4)) == "four");
  CHECK(shard_of(d.path, replaced.superseded_as) == "fouR");
}

TEST_CASE("what older Loom left after a kill mid-replacement is recovered", "[train][checkpoint][faults]") {
  // The former sequence iter_N -> iter_N.old, iter_N.tmp -> iter_N, killed in between: the
  // tracker names a folder that is not there.
  TempDir d;
  make_folder(d.path, iteration_dir_name(4) + ".old", 4, "four, first save");
  make_folder(d.path, iteration_dir_name(4) + ".tmp", 4, "four, second save");
  write(d.path + "/" + kTrackerFile, "4\n");
  recover_checkpoint_dir(d.path);
  CHECK(incomplete_reason(d.path, 4).empty());
  CHECK(shard_of(d.path, iteration_dir_name(4)) == "four, second save");
  CHECK(folders_with(d.path, ".superseded-").size() == 1);

  TempDir e;  // killed before the .tmp was complete: the old copy comes back
  make_folder(e.path, iteration_dir_name(6) + ".old", 6, "six");
  ::mkdir((e.path + "/" + iteration_dir_name(6) + ".tmp").c_str(), 0755);
  write(e.path + "/" + kTrackerFile, "6\n");
  recover_checkpoint_dir(e.path);
  CHECK(shard_of(e.path, iteration_dir_name(6)) == "six");
  CHECK(folders_with(e.path, ".tmp").empty());
}

TEST_CASE("iterations are listed and judged complete from the folders", "[train][checkpoint]") {
  TempDir d;
  make_folder(d.path, iteration_dir_name(2), 2, "two");
  make_folder(d.path, iteration_dir_name(4), 4, "four");
  make_folder(d.path, iteration_dir_name(6), 6, "six");
  make_folder(d.path, iteration_dir_name(8) + ".superseded-1", 8, "eight");
  write(d.path + "/" + iteration_dir_name(6) + "/mp_rank_00/" + kShardFileName, "si");  // truncated
  CHECK(list_iterations(d.path) == std::vector<int64_t>{2, 4, 6});
  CHECK_THAT(incomplete_reason(d.path, 6), Catch::Contains("is truncated or altered: 2 bytes, metadata.json says 3"));
  CHECK(newest_complete_iteration(d.path) == 4);
  CHECK(newest_complete_iteration(d.path, 4) == 2);
  CHECK_FALSE(newest_complete_iteration(d.path, 2).has_value());
  CHECK(list_iterations(d.path + "/missing").empty());
}

TEST_CASE("trackers and metadata that are not what a save writes are named errors", "[train][checkpoint]") {
  CHECK(parse_tracker("12\n", "t") == 12);
  CHECK_THROWS_WITH(parse_tracker("99999999999999999999\n", "t"),
                    "t: expected an iteration number of at most 999999999999, found '99999999999999999999'");
  CHECK_THROWS_WITH(parse_tracker("-3", "t"), "t: expected an iteration number, found '-3'");
  CHECK_THROWS_WITH(parse_tracker("", "t"), "t: expected an iteration number, found ''");
  CHECK_THROWS_AS(parse_tracker(std::string(1000, '9'), "t"), CheckpointError);

  CHECK_THROWS_WITH(parse_checkpoint_metadata("{", "m"), "m is not valid JSON");
  CHECK_THROWS_WITH(parse_checkpoint_metadata("[]", "m"), "m: expected a JSON object, found array");
  const std::string good = R"({"format": "f", "iteration": 4, "layout": {"tensor_model_parallel_size": 1,
      "pipeline_model_parallel_size": 1, "virtual_pipeline_model_parallel_size": 1, "data_parallel_size": 1,
      "model": {}}, "files": {"mp_rank_00/model_optim_rng.pt": {"bytes": 3, "fnv1a64": "0123456789abcdef"}}})";
  CHECK_NOTHROW(parse_checkpoint_metadata(good, "m"));
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  CHECK_THROWS_WITH(parse_checkpoint_metadata(with("\"iteration\": 4", "\"iteration\": -4"), "m"),
                    Catch::Contains("\"iteration\" in [0, 999999999999], found -4"));
  CHECK_THROWS_WITH(parse_checkpoint_metadata(with("mp_rank_00/", "../../etc/"), "m"),
                    Catch::Contains("expected shard paths mp_rank_TT[_PPP]/model_optim_rng.pt"));
  CHECK_THROWS_WITH(parse_checkpoint_metadata(with("\"bytes\": 3", "\"bytes\": \"3\""), "m"),
                    Catch::Contains("expected an integer \"bytes\""));
  CHECK_THROWS_WITH(parse_checkpoint_metadata(with("0123456789abcdef", "xyz"), "m"),
                    Catch::Contains("16 hex digits"));
  CHECK_THROWS_WITH(parse_checkpoint_metadata(with("\"data_parallel_size\": 1", "\"data_parallel_size\": 0"), "m"),
                    Catch::Contains("layout: expected \"data_parallel_size\" in [1, 16777216], found 0"));
}
