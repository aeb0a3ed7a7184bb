// Torch-free on purpose: the fuzz target (tools/fuzz) compiles this file on its own.
#include "train/checkpoint_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "launch/file_util.h"

namespace loom::train {
namespace {

using nlohmann::json;

constexpr const char* kSupersededMark = ".superseded-";
constexpr size_t kMaxMetadataBytes = size_t{64} << 20;  // thousands of shards fit in a few MB

std::string join(const std::string& dir, const std::string& name) { return dir + "/" + name; }

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::optional<int64_t> regular_file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  return static_cast<int64_t>(st.st_size);
}

std::string sys_error(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: some file systems cannot open directories
  ::fsync(fd);
  ::close(fd);
}

void rename_or_throw(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0)
    throw CheckpointError(sys_error("cannot rename", from) + " (to " + to + ")");
}

std::optional<std::string> read_small_file(const std::string& path, size_t limit) {
  const auto size = regular_file_size(path);
  if (!size || static_cast<size_t>(*size) > limit) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

bool all_digits(const std::string& s, size_t from, size_t to) {
  if (from >= to) return false;
  for (size_t i = from; i < to; ++i)
    if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

/// "mp_rank_TT/model_optim_rng.pt" or "mp_rank_TT_PPP/model_optim_rng.pt": a shard path that
/// stays inside its iteration folder.
bool is_shard_path(const std::string& rel) {
  const std::string prefix = "mp_rank_", suffix = std::string("/") + kShardFileName;
  if (rel.size() <= prefix.size() + suffix.size() || rel.compare(0, prefix.size(), prefix) != 0 ||
      rel.compare(rel.size() - suffix.size(), suffix.size(), suffix) != 0)
    return false;
  const std::string ranks = rel.substr(prefix.size(), rel.size() - prefix.size() - suffix.size());
  const size_t underscore = ranks.find('_');
  if (underscore == std::string::npos) return all_digits(ranks, 0, ranks.size());
  return all_digits(ranks, 0, underscore) && all_digits(ranks, underscore + 1, ranks.size());
}

bool is_hex16(const std::string& s) {
  if (s.size() != 16) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

int64_t integer_field(const json& object, const char* key, int64_t min, int64_t max, const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end() || !it->is_number_integer())
    throw CheckpointError(where + ": expected an integer \"" + key + "\", found " +
                          (it == object.end() ? std::string("none") : it->dump()));
  const int64_t value = it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(INT64_MAX)
                            ? INT64_MAX
                            : it->get<int64_t>();
  if (value < min || value > max)
    throw CheckpointError(fmt::format("{}: expected \"{}\" in [{}, {}], found {}", where, key, min, max, it->dump()));
  return value;
}

/// Iteration N of a folder name "iter_NNNNNNN", nullopt for anything else.
std::optional<int64_t> iteration_of(const std::string& name) {
  if (name.size() < 12 || name.compare(0, 5, "iter_") != 0 || name.size() > 5 + 12 || !all_digits(name, 5, name.size()))
    return std::nullopt;
  return std::stoll(name.substr(5));
}

std::string folder_incomplete_reason(const std::string& folder, int64_t iteration) {
  if (!is_directory(folder)) return folder + " does not exist";
  const std::string meta_path = join(folder, "metadata.json");
  const auto text = read_small_file(meta_path, kMaxMetadataBytes);
  if (!text) return meta_path + " is missing or unreadable";
  json meta;
  try {
    meta = parse_checkpoint_metadata(*text, meta_path);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  if (meta["iteration"].get<int64_t>() != iteration)
    return fmt::format("{} names iteration {}, not {}", meta_path, meta["iteration"].dump(), iteration);
  for (const auto& [rel, record] : meta["files"].items()) {
    const std::string shard = join(folder, rel);
    const auto size = regular_file_size(shard);
    if (!size) return shard + " is missing";
    if (*size != record["bytes"].get<int64_t>())
      return fmt::format("{} is truncated or altered: {} bytes, metadata.json says {}", shard, *size,
                         record["bytes"].get<int64_t>());
  }
  return "";
}

std::string first_free_superseded_name(const std::string& dir, int64_t iteration) {
  for (int k = 1;; ++k) {
    const std::string name = iteration_dir_name(iteration) + kSupersededMark + std::to_string(k);
    if (!exists(join(dir, name))) return name;
  }
}

/// Whether `existing` holds intact shards equal to those `fresh`'s metadata lists: the same
/// metadata files, and every shard of `existing` hashing to its record (a damaged copy with
/// the right metadata must be superseded, not kept).
bool same_files(const std::string& existing, const std::string& fresh) {
  const auto te = read_small_file(join(existing, "metadata.json"), kMaxMetadataBytes);
  const auto tf = read_small_file(join(fresh, "metadata.json"), kMaxMetadataBytes);
  if (!te || !tf) return false;
  const json je = json::parse(*te, nullptr, false), jf = json::parse(*tf, nullptr, false);
  if (!je.is_object() || !jf.is_object() || !je.contains("files") || !je["files"].is_object() ||
      je["files"] != jf.value("files", json()))
    return false;
  for (const auto& [rel, record] : je["files"].items()) {
    std::ifstream in(join(existing, rel), std::ios::binary);
    if (!in || !record.is_object() || !record.contains("fnv1a64")) return false;
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (fmt::format("{:016x}", fnv1a64(bytes.data(), bytes.size())) != record["fnv1a64"]) return false;
  }
  return true;
}

}  // namespace

std::string iteration_dir_name(int64_t iteration) { return fmt::format("iter_{:07d}", iteration); }

std::string model_parallel_dir_name(int tensor_rank, int pipeline_rank, int pipeline_parallel) {
  return pipeline_parallel == 1 ? fmt::format("mp_rank_{:02d}", tensor_rank)
                                : fmt::format("mp_rank_{:02d}_{:03d}", tensor_rank, pipeline_rank);
}

int64_t parse_tracker(const std::string& text, const std::string& file) {
  std::string t = text;
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r' || t.back() == ' ' || t.back() == '\t')) t.pop_back();
  std::string shown = t.substr(0, 40);
  for (char& c : shown)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  if (t.size() > 40) shown += "...";
  if (!all_digits(t, 0, t.size()))
    throw CheckpointError(file + ": expected an iteration number, found '" + shown + "'");
  if (t.size() > 12 || std::stoll(t) > kMaxIteration)
    throw CheckpointError(fmt::format("{}: expected an iteration number of at most {}, found '{}'", file,
                                      kMaxIteration, shown));
  return std::stoll(t);
}

json parse_checkpoint_metadata(const std::string& text, const std::string& file) {
  json meta = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (meta.is_discarded()) throw CheckpointError(file + " is not valid JSON");
  if (!meta.is_object()) throw CheckpointError(file + ": expected a JSON object, found " + std::string(meta.type_name()));
  if (!meta.contains("format") || !meta["format"].is_string())
    throw CheckpointError(file + ": expected a string \"format\" (loom-megatron-legacy-1)");
  integer_field(meta, "iteration", 0, kMaxIteration, file);
  if (!meta.contains("layout") || !meta["layout"].is_object())
    throw CheckpointError(file + ": expected a \"layout\" object");
  const json& layout = meta["layout"];
  for (const char* key : {"tensor_model_parallel_size", "pipeline_model_parallel_size",
                          "virtual_pipeline_model_parallel_size", "data_parallel_size"})
    integer_field(layout, key, 1, 1 << 24, file + ": layout");
  if (!layout.contains("model") || !layout["model"].is_object())
    throw CheckpointError(file + ": expected a \"layout.model\" object");
  if (!meta.contains("files") || !meta["files"].is_object() || meta["files"].empty())
    throw CheckpointError(file + ": expected a non-empty \"files\" object");
  for (const auto& [rel, record] : meta["files"].items()) {
    if (!is_shard_path(rel))
      throw CheckpointError(file + ": files: expected shard paths mp_rank_TT[_PPP]/" + kShardFileName + ", found \"" +
                            rel.substr(0, 80) + "\"");
    if (!record.is_object()) throw CheckpointError(file + ": files: \"" + rel + "\" is not an object");
    integer_field(record, "bytes", 0, INT64_MAX, file + ": files: " + rel);
    if (!record.contains("fnv1a64") || !record["fnv1a64"].is_string() || !is_hex16(record["fnv1a64"].get<std::string>()))
      throw CheckpointError(file + ": files: " + rel + ": expected \"fnv1a64\" of 16 hex digits");
  }
  return meta;
}

std::vector<int64_t> list_iterations(const std::string& dir) {
  std::vector<int64_t> out;
  if (!is_directory(dir)) return out;
  for (const auto& name : launch::list_directory(dir)) {
    if (const auto it = iteration_of(name); it && is_directory(join(dir, name))) out.push_back(*it);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string incomplete_reason(const std::string& dir, int64_t iteration) {
  return folder_incomplete_reason(join(dir, iteration_dir_name(iteration)), iteration);
}

std::optional<int64_t> newest_complete_iteration(const std::string& dir, std::optional<int64_t> below) {
  const auto all = list_iterations(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (below && *it >= *below) continue;
    if (incomplete_reason(dir, *it).empty()) return *it;
  }
  return std::nullopt;
}

void write_file_durably(const std::string& path, const char* data, size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw CheckpointError(sys_error("cannot create checkpoint file", path));
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string message = sys_error("cannot write checkpoint file", path);
      ::close(fd);
      throw CheckpointError(message);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) throw CheckpointError(sys_error("cannot flush checkpoint file", path));
}

void write_text_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  write_file_durably(tmp, text.data(), text.size());
  rename_or_throw(tmp, path);
}

CommitResult commit_checkpoint(const std::string& dir, int64_t iteration,
                               const std::function<void(CommitStep)>& before_step) {
  auto step = [&](CommitStep s) {
    if (before_step) before_step(s);
  };
  const std::string final_dir = join(dir, iteration_dir_name(iteration));
  const std::string tmp_dir = final_dir + ".tmp";
  CommitResult result;
  if (is_directory(final_dir)) {
    result.same_as_existing = same_files(final_dir, tmp_dir);
    if (!result.same_as_existing) result.superseded_as = first_free_superseded_name(dir, iteration);
  }
  fsync_dir(tmp_dir);

  step(CommitStep::kJournal);
  write_text_atomically(join(dir, kCommitJournal),
                        json{{"iteration", iteration},
                             {"supersede", result.superseded_as},
                             {"same_as_existing", result.same_as_existing}}
                            .dump());
  fsync_dir(dir);

  step(CommitStep::kSupersede);
  if (result.same_as_existing) {
    launch::remove_tree(tmp_dir);
  } else if (!result.superseded_as.empty()) {
    rename_or_throw(final_dir, join(dir, result.superseded_as));
  }

  step(CommitStep::kRename);
  if (!result.same_as_existing) rename_or_throw(tmp_dir, final_dir);
  fsync_dir(dir);

  step(CommitStep::kTracker);
  write_text_atomically(join(dir, kTrackerFile), std::to_string(iteration) + "\n");
  fsync_dir(dir);

  step(CommitStep::kClearJournal);
  if (std::remove(join(dir, kCommitJournal).c_str()) != 0)
    throw CheckpointError(sys_error("cannot remove", join(dir, kCommitJournal)));
  fsync_dir(dir);
  step(CommitStep::kDone);
  return result;
}

std::vector<std::string> recover_checkpoint_dir(const std::string& dir) {
  std::vector<std::string> actions;
  if (!is_directory(dir)) return actions;
  const std::string journal_path = join(dir, kCommitJournal);
  if (exists(journal_path)) {
    const auto text = read_small_file(journal_path, 1 << 16);
    const json journal = text ? json::parse(*text, nullptr, false) : json();
    const bool valid = journal.is_object() && journal.contains("iteration") &&
                       journal["iteration"].is_number_integer() && journal.value("supersede", json()).is_string();
    if (!valid) {
      // Written by rename, so never partial: damaged storage. The folders decide below.
      actions.push_back(journal_path + " was unreadable: removed it");
    } else {
      const int64_t n = journal["iteration"].get<int64_t>();
      const std::string superseded = journal["supersede"].get<std::string>();
      const bool same = journal.value("same_as_existing", false);
      const std::string final_dir = join(dir, iteration_dir_name(n)), tmp_dir = final_dir + ".tmp";
      if (!same && exists(tmp_dir) && folder_incomplete_reason(tmp_dir, n).empty()) {
        if (is_directory(final_dir) && !superseded.empty() && !exists(join(dir, superseded)))
          rename_or_throw(final_dir, join(dir, superseded));
        if (!is_directory(final_dir)) {
          rename_or_throw(tmp_dir, final_dir);
          actions.push_back("finished the interrupted commit of " + final_dir +
                            (superseded.empty() ? "" : " (the earlier one kept as " + superseded + ")"));
        }
      } else if (!folder_incomplete_reason(final_dir, n).empty() && !superseded.empty() &&
                 is_directory(join(dir, superseded))) {
        rename_or_throw(join(dir, superseded), final_dir);  // cannot happen unless storage lost the new copy
        actions.push_back("rolled back the interrupted commit of " + final_dir);
      }
      if (exists(tmp_dir)) launch::remove_tree(tmp_dir);
      if (folder_incomplete_reason(final_dir, n).empty()) {
        write_text_atomically(join(dir, kTrackerFile), std::to_string(n) + "\n");
        if (actions.empty()) actions.push_back("finished the interrupted commit of " + final_dir);
      }
    }
    std::remove(journal_path.c_str());
    fsync_dir(dir);
  }
  for (const auto& name : launch::list_directory(dir)) {
    const std::string path = join(dir, name);
    // Loom before the journal replaced an iteration by iter_N -> iter_N.old, iter_N.tmp ->
    // iter_N: a kill in between left no iter_N.
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".old") == 0) {
      const auto n = iteration_of(name.substr(0, name.size() - 4));
      if (!n) continue;
      const std::string final_dir = join(dir, iteration_dir_name(*n)), tmp_dir = final_dir + ".tmp";
      if (!is_directory(final_dir) && exists(tmp_dir) && folder_incomplete_reason(tmp_dir, *n).empty()) {
        rename_or_throw(tmp_dir, final_dir);
        actions.push_back("finished the interrupted replacement of " + final_dir);
      }
      if (!is_directory(final_dir)) {
        rename_or_throw(path, final_dir);
        actions.push_back("restored " + final_dir + " from " + name);
      } else {
        const std::string keep = first_free_superseded_name(dir, *n);
        rename_or_throw(path, join(dir, keep));
        actions.push_back("kept the replaced " + name + " as " + keep);
      }
    }
  }
  for (const auto& name : launch::list_directory(dir)) {
    const bool unfinished_save = name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0 &&
                                 iteration_of(name.substr(0, name.size() - 4));
    const bool temp_file = name == std::string(kTrackerFile) + ".tmp" || name == std::string(kCommitJournal) + ".tmp";
    if (!unfinished_save && !temp_file) continue;
    launch::remove_tree(join(dir, name));
    if (unfinished_save) actions.push_back("removed " + join(dir, name) + ", a save that did not finish");
  }
  if (!actions.empty()) fsync_dir(dir);
  return actions;
}

}  // namespace loom::train
