// One run (`loom train`, `loom ptune`) per run directory (docs/design/hardening.md, "Run directory lock"): two runs
// on one directory would interleave metrics and commit checkpoints over each other. The lock
// is an exclusive flock on <run_dir>/train.lock, held by world rank 0 for the whole run; the
// kernel releases it when the process ends however it ends, so a lock left by a killed run is
// never in the way (the file's text only says who held it last). No torch.
#pragma once
#include <stdexcept>
#include <string>

namespace loom::launch {

/// The run directory is in use by another process: commands exit with status 2. The message
/// names the directory and the holder (pid, host, start time, command).
class RunLockError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class RunDirectoryLock {
 public:
  /// Creates `run_dir` if needed and takes its lock without waiting. Throws RunLockError naming
  /// the holder when another process has it, std::runtime_error when the file cannot be made.
  /// `command` is recorded for the holder's description (e.g. "loom train recipe.yaml").
  RunDirectoryLock(const std::string& run_dir, const std::string& command);
  ~RunDirectoryLock();
  RunDirectoryLock(const RunDirectoryLock&) = delete;
  RunDirectoryLock& operator=(const RunDirectoryLock&) = delete;

  /// What the lock file said about an earlier holder that is gone (its process ended without
  /// releasing, e.g. killed): "" when the lock was released cleanly or never taken.
  const std::string& stale_holder() const { return stale_holder_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string stale_holder_;
  int fd_ = -1;
};

}  // namespace loom::launch
