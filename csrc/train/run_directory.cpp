#include "train/run_directory.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <chrono>
#include <filesystem>

#include "config/derived.h"
#include "launch/local_launcher.h"
#include "train/checkpoint_files.h"

namespace fs = std::filesystem;

namespace loom::train {

RunDirectoryOptions run_directory_options(const config::Recipe& recipe, const std::string& command,
                                          std::optional<int64_t> resume_iteration) {
  RunDirectoryOptions d;
  d.run_dir = config::run_directory(recipe);
  d.command = command;
  d.recipe_file = recipe.origin.file;
  d.resume_iteration = resume_iteration;
  d.resume_if_exists = recipe.exp_manager.resume_if_exists;
  d.save_checkpoints = recipe.exp_manager.create_checkpoint_callback;
  return d;
}

RunDirectory::RunDirectory(RunDirectoryOptions options, bool rank0)
    : options_(std::move(options)), checkpoint_dir_(checkpoints_dir(options_)) {
  // Before anything in the run directory is touched: one run per directory.
  if (rank0) lock_ = std::make_unique<launch::RunDirectoryLock>(options_.run_dir, options_.command + " " + options_.recipe_file);
}

RunDirectory::~RunDirectory() = default;

void RunDirectory::attach(runtime::ProcessGroups& groups, MetricsLog& log) {
  groups_ = &groups;
  log_ = &log;
  if (lock_ && !lock_->stale_holder().empty())
    log.message("[loom] the previous holder of " + lock_->path() + " ended without releasing it (" +
                lock_->stale_holder() + ")");
}

namespace {

// What to do when the checkpoint below `below` cannot be resumed from.
std::string older_checkpoint_advice(const RunDirectoryOptions& options, int64_t below) {
  const std::string dir = checkpoints_dir(options);
  const auto older = newest_complete_iteration(dir, below);
  if (!older)
    return "; no older complete checkpoint exists in " + dir +
           " (set exp_manager.resume_if_exists=false to start afresh; the folders are kept)";
  return fmt::format("; the newest complete older checkpoint is {}: resume from it with `{} {} ... "
                     "--iteration {}` (newer folders are kept, a re-saved iteration as .superseded-K)",
                     iteration_dir_name(*older), options.command, options.recipe_file, *older);
}

}  // namespace

std::string checkpoints_dir(const RunDirectoryOptions& options) {
  return (fs::path(options.run_dir) / "checkpoints").string();
}

std::optional<int64_t> resume_iteration(const RunDirectoryOptions& options, std::string* note) {
  if (!options.resume_if_exists) return std::nullopt;
  const std::string dir = checkpoints_dir(options);
  if (options.resume_iteration) {
    const int64_t n = *options.resume_iteration;
    const std::string why = incomplete_reason(dir, n);
    if (!why.empty())
      throw CheckpointError(fmt::format("--iteration {}: cannot resume from it: {}{}", n, why,
                                        older_checkpoint_advice(options, n)));
    return n;
  }
  if (fs::exists(fs::path(dir) / kTrackerFile)) {
    int64_t n = 0;
    try {
      n = *latest_checkpoint(dir);
    } catch (const CheckpointError& e) {
      throw CheckpointError(e.what() + older_checkpoint_advice(options, kMaxIteration + 1));
    }
    const std::string why = incomplete_reason(dir, n);
    if (!why.empty())
      throw CheckpointError("the newest checkpoint is incomplete: " + why + older_checkpoint_advice(options, n));
    return n;
  }
  const auto all = list_iterations(dir);
  if (all.empty()) return std::nullopt;
  const auto newest = newest_complete_iteration(dir);
  if (!newest) {
    std::string listing;
    for (int64_t n : all) listing += "\n  " + incomplete_reason(dir, n);
    throw CheckpointError(fmt::format("{} has no {} and none of its {} iteration folders is complete:{}\nmove them "
                                      "away to start afresh, or repair one",
                                      dir, kTrackerFile, all.size(), listing));
  }
  if (note)
    *note = fmt::format("[loom] no {} in {}: resuming from the newest complete checkpoint {}", kTrackerFile, dir,
                        iteration_dir_name(*newest));
  return newest;
}

std::optional<ResumePoint> RunDirectory::resume(const CheckpointLayout& layout) {
  // Rank 0 (holding the lock) finishes or rolls back what a killed save left before anyone reads.
  std::string recovery_error;
  if (lock_) {
    try {
      for (const auto& line : recover_checkpoint_dir(checkpoint_dir_)) log_->message("[loom] checkpoints: " + line);
    } catch (const std::exception& e) {
      recovery_error = e.what();
    }
  }
  groups_->host_world().barrier();
  if (!recovery_error.empty()) throw CheckpointError("recovering " + checkpoint_dir_ + ": " + recovery_error);
  std::string note;
  const auto iteration = resume_iteration(options_, &note);
  if (!note.empty()) log_->message(note);
  if (!iteration) return std::nullopt;
  // Every rank reads its own shard; they agree on the outcome, so that a damaged shard stops
  // all ranks with one clear error instead of one rank failing and the rest losing a peer.
  RankCheckpoint state;
  std::string error;
  try {
    state = load_checkpoint(checkpoint_dir_, *iteration, layout, *groups_);
  } catch (const CheckpointError& e) {
    error = e.what();
  }
  // host: one flag per rank, summed on the host group.
  at::Tensor failed = at::zeros({groups_->layout().world_size()}, at::kLong);
  failed[groups_->rank()] = error.empty() ? 0 : 1;
  groups_->host_world().all_reduce(failed);
  if (!error.empty()) throw CheckpointError(error + older_checkpoint_advice(options_, *iteration));
  for (int r = 0; r < failed.size(0); ++r) {
    if (failed[r].item<int64_t>() == 0) continue;
    const std::string message = fmt::format("another rank (rank {}) could not load checkpoint {}", r,
                                            iteration_dir_name(*iteration));
    launch::record_rank_error(message, /*consequence=*/true);
    throw CheckpointError(message);
  }
  return ResumePoint{*iteration, std::move(state)};
}

std::string RunDirectory::iteration_path(int64_t iteration) const {
  return (fs::path(checkpoint_dir_) / iteration_dir_name(iteration)).string();
}

void RunDirectory::save(int64_t iteration, const CheckpointLayout& layout,
                        const std::function<RankCheckpoint()>& capture) {
  if (!options_.save_checkpoints) return;  // timing runs (loom plan --measure)
  if (iteration == last_saved_) return;    // a stop landing on a periodic save: already on disk
  last_saved_ = iteration;
  const auto start = std::chrono::steady_clock::now();
  const CommitResult commit = save_checkpoint(checkpoint_dir_, iteration, layout, capture(), *groups_);
  if (!commit.superseded_as.empty())
    log_->message(fmt::format("[loom] {} existed from an earlier run: kept it as {}", iteration_dir_name(iteration),
                              commit.superseded_as));
  log_->message(fmt::format("[loom] saved checkpoint {}/{} in {:.1f} s", checkpoint_dir_, iteration_dir_name(iteration),
                            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()));
  log_->note_checkpoint(iteration_path(iteration));
}

void RunDirectory::write_resolved_recipe(const config::Recipe& recipe) {
  // Only now that the run has really started: a run that failed to resume leaves the earlier
  // run's config.yaml as it was.
  if (lock_) write_text_atomically((fs::path(options_.run_dir) / "config.yaml").string(), config::to_yaml(recipe));
}

}  // namespace loom::train
