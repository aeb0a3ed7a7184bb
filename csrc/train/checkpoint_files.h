// A checkpoint directory on disk, without torch (docs/design/hardening.md, "Checkpoints"): the
// tracker, metadata.json, which iterations are complete, the commit of a finished save and the
// recovery of a commit that was killed half-way. checkpoint.h writes and reads the shards.
//
// A save writes iter_N.tmp/ (shards, then metadata.json with every shard's size and hash) and
// then commits it, on data-parallel rank 0 of the world:
//   1. commit_in_progress.json  {"iteration": N, "supersede": "iter_N.superseded-K" or ""}
//   2. an existing iter_N from an earlier run is renamed iter_N.superseded-K (never deleted;
//      if its shards hash to exactly the new ones, the new copy is dropped instead)
//   3. iter_N.tmp -> iter_N
//   4. latest_checkpointed_iteration.txt <- N (temporary name + rename)
//   5. the journal is removed.
// A kill before step 1 leaves the previous checkpoint as the one that loads; a kill after it is
// finished on the next start (recover_checkpoint_dir), so a committed iteration is never lost
// and the tracker never names a folder that is not there. Files are fsynced before each rename.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace loom::train {

/// A checkpoint that cannot be read or used: commands exit with status 2. The message names
/// the file and what was expected.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr const char* kTrackerFile = "latest_checkpointed_iteration.txt";
inline constexpr const char* kShardFileName = "model_optim_rng.pt";
inline constexpr const char* kCommitJournal = "commit_in_progress.json";
/// Largest iteration a tracker or metadata.json may name (a larger one is corrupt).
inline constexpr int64_t kMaxIteration = 999999999999;

/// "iter_0000100".
std::string iteration_dir_name(int64_t iteration);
/// "mp_rank_01" (p = 1) or "mp_rank_01_002".
std::string model_parallel_dir_name(int tensor_rank, int pipeline_rank, int pipeline_parallel);

/// The iteration in a tracker's text ("123\n"). Throws CheckpointError naming `file` when the
/// text is not one decimal number in [0, kMaxIteration].
int64_t parse_tracker(const std::string& text, const std::string& file);

/// metadata.json's text, checked: an object with "format", "iteration" (in [0, kMaxIteration]),
/// "layout" (positive integer sizes tensor/pipeline/virtual/data parallel and a "model"
/// object) and "files" mapping "mp_rank_TT[_PPP]/model_optim_rng.pt" to {"bytes" >= 0,
/// "fnv1a64": 16 hex digits}. Throws CheckpointError naming `file` and the field otherwise.
nlohmann::json parse_checkpoint_metadata(const std::string& text, const std::string& file);

/// Committed iterations of `dir` (folders named exactly iter_NNNNNNN), ascending; none when
/// `dir` does not exist.
std::vector<int64_t> list_iterations(const std::string& dir);

/// Why iteration `iteration` of `dir` cannot be loaded, judged without reading the shards:
/// its folder or metadata.json is missing or invalid, or a listed shard is missing or has
/// another size. "" when it is complete (loading still checks every shard's hash).
std::string incomplete_reason(const std::string& dir, int64_t iteration);

/// The newest complete iteration of `dir` below `below` (any when nullopt), or nullopt.
std::optional<int64_t> newest_complete_iteration(const std::string& dir, std::optional<int64_t> below = {});

/// FNV-1a, 64 bit, of `size` bytes: the content hash metadata.json records for each shard.
uint64_t fnv1a64(const char* data, size_t size);

/// Writes a file and flushes it to disk; throws CheckpointError naming it on failure.
void write_file_durably(const std::string& path, const char* data, size_t size);
/// Replaces `path` with `text` atomically (a temporary name, fsync, rename).
void write_text_atomically(const std::string& path, const std::string& text);

/// The steps of commit_checkpoint, in order (see the top of this file).
enum class CommitStep { kJournal, kSupersede, kRename, kTracker, kClearJournal, kDone };

struct CommitResult {
  bool same_as_existing = false;  ///< iter_N already held these files; the new copy was dropped
  std::string superseded_as;      ///< the folder an earlier run's iter_N was kept as, or ""
};

/// Commits `dir`/iter_N.tmp (complete: its metadata.json written last) as iteration N.
/// `before_step`, when set, is called before each step (tests end the process there to check
/// every kill point). Throws CheckpointError naming the path on a file-system failure.
CommitResult commit_checkpoint(const std::string& dir, int64_t iteration,
                               const std::function<void(CommitStep)>& before_step = {});

/// Finishes a commit that a killed process left half-done (per its journal), removes saves
/// that never reached the journal (iter_*.tmp, a tracker's temporary file), and restores what
/// older versions of Loom could leave (iter_N.old). Returns one line per action, for the log.
/// Run by one process while no save is running (the run directory lock, launch/run_lock.h).
std::vector<std::string> recover_checkpoint_dir(const std::string& dir);

}  // namespace loom::train
