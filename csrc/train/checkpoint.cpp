#include "train/checkpoint.h"

#include "train/checkpoint_serialize.h"
#include "train/mapped_shard.h"

#include "launch/file_util.h"
#include "rules/model_shape_json.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;

namespace loom::train {
namespace {

constexpr const char* kTracker = kTrackerFile;
constexpr const char* kShardFile = kShardFileName;

// A cheap content hash to tell a corrupt shard from a good one.
uint64_t fnv1a(const std::vector<char>& bytes) { return fnv1a64(bytes.data(), bytes.size()); }

void write_file(const fs::path& path, const char* data, size_t size) {
  write_file_durably(path.string(), data, size);
}

c10::impl::GenericDict tensor_dict(const std::map<std::string, at::Tensor>& tensors) {
  c10::impl::GenericDict d(c10::StringType::get(), c10::TensorType::get());
  for (const auto& [k, v] : tensors) d.insert(k, v.detach().cpu().contiguous());
  return d;
}

std::map<std::string, at::Tensor> tensor_map(const c10::IValue& v, const std::string& file,
                                             const char* what) {
  if (!v.isGenericDict()) throw CheckpointError(file + ": '" + what + "' is not a dictionary");
  std::map<std::string, at::Tensor> out;
  for (const auto& e : v.toGenericDict()) {
    if (!e.key().isString() || !e.value().isTensor()) {
      throw CheckpointError(file + ": '" + what + "' holds a non-tensor entry");
    }
    out[e.key().toStringRef()] = e.value().toTensor();
  }
  return out;
}

nlohmann::json optional_int(const std::optional<int>& v) { return v ? nlohmann::json(*v) : nlohmann::json(); }

nlohmann::json layout_json(const CheckpointLayout& l) {
  nlohmann::json out = {{"tensor_model_parallel_size", l.parallel.tp},
                        {"pipeline_model_parallel_size", l.parallel.pp},
                        {"virtual_pipeline_model_parallel_size", l.parallel.vp},
                        {"data_parallel_size", l.parallel.dp},
                        {"model", l.model_json()}};
  // Per-stage layers (docs/design/formats.md, "Checkpoints"): written always, so a reader sees
  // which layers each mp_rank_TT_PPP shard holds without redoing the split.
  if (!l.stage_layers.empty()) {
    out["stage_layers"] = l.stage_layers;
    out["num_layers_in_first_pipeline_stage"] = optional_int(l.parallel.first_stage_layers);
    out["num_layers_in_last_pipeline_stage"] = optional_int(l.parallel.last_stage_layers);
  }
  return out;
}

/// The layers of each stage a checkpoint's metadata records; an older checkpoint without the
/// record was split evenly. Read after the model shape matched (load_checkpoint), so its
/// `num_layers` is the run's.
std::vector<int64_t> saved_stage_layers(const nlohmann::json& layout, int64_t num_layers) {
  if (layout.contains("stage_layers") && layout["stage_layers"].is_array()) {
    std::vector<int64_t> out;
    for (const auto& n : layout["stage_layers"]) out.push_back(n.is_number_integer() ? n.get<int64_t>() : -1);
    return out;
  }
  const int64_t p = layout.value("pipeline_model_parallel_size", 1);
  return std::vector<int64_t>(static_cast<size_t>(std::max<int64_t>(p, 1)), num_layers / std::max<int64_t>(p, 1));
}

}  // namespace

nlohmann::json CheckpointLayout::model_json() const {
  nlohmann::json out = model_shape_to_json(model_shape);
  for (const auto& [key, value] : task_record.items()) out[key] = value;
  return out;
}

std::vector<char> serialize_rank_checkpoint(const RankCheckpoint& state, int64_t iteration) {
  c10::impl::GenericDict top(c10::StringType::get(), c10::AnyType::get());
  nlohmann::json meta = {{"shards", state.shard_info}, {"values", state.values}, {"iteration", iteration}};
  top.insert("model", tensor_dict(state.model));
  top.insert("optimizer", tensor_dict(state.optimizer));
  top.insert("meta", meta.dump());
  return torch::pickle_save(top);
}

nlohmann::json shard_file_record(const std::vector<char>& bytes) {
  return {{"bytes", static_cast<int64_t>(bytes.size())}, {"fnv1a64", fmt::format("{:016x}", fnv1a(bytes))}};
}

nlohmann::json checkpoint_metadata(int64_t iteration, const CheckpointLayout& layout, const nlohmann::json& files) {
  return {{"format", "loom-megatron-legacy-1"}, {"iteration", iteration}, {"layout", layout_json(layout)},
          {"files", files}};
}

CommitResult save_checkpoint(const std::string& dir, int64_t iteration, const CheckpointLayout& layout,
                     const RankCheckpoint& state, runtime::ProcessGroups& groups) {
  const auto coords = groups.coords();
  const int world = groups.layout().world_size();
  const fs::path final_dir = fs::path(dir) / iteration_dir_name(iteration);
  const fs::path tmp_dir = fs::path(dir) / (iteration_dir_name(iteration) + ".tmp");
  const std::string mp_name =
      model_parallel_dir_name(coords.tp, coords.pp, groups.layout().pipeline_parallel());

  std::string error;
  CommitResult commit;
  if (groups.rank() == 0) {
    try {
      fs::create_directories(dir);
      launch::remove_tree(tmp_dir.string());  // a save that died half-way
      fs::create_directories(tmp_dir);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  groups.host_world().barrier();
  if (!error.empty()) throw CheckpointError("cannot prepare " + tmp_dir.string() + ": " + error);

  // Sizes and hashes of the shards, one slot per world rank (0 for non-writers).
  // host: values of the file system, exchanged on the host group.
  at::Tensor sizes = at::zeros({world}, at::kLong), hashes = at::zeros({world}, at::kLong);
  if (coords.dp == 0) {
    std::vector<char> bytes = serialize_rank_checkpoint(state, iteration);
    fs::create_directories(tmp_dir / mp_name);
    write_file(tmp_dir / mp_name / kShardFile, bytes.data(), bytes.size());
    sizes[groups.rank()] = static_cast<int64_t>(bytes.size());
    hashes[groups.rank()] = static_cast<int64_t>(fnv1a(bytes));
  }
  groups.host_world().all_reduce(sizes);
  groups.host_world().all_reduce(hashes);

  if (groups.rank() == 0) {
    try {
      nlohmann::json files = nlohmann::json::object();
      for (int r = 0; r < world; ++r) {
        auto c = groups.layout().coords(r);
        if (c.dp != 0) continue;
        std::string rel = model_parallel_dir_name(c.tp, c.pp, groups.layout().pipeline_parallel()) +
                          "/" + kShardFile;
        if (!fs::exists(tmp_dir / rel)) throw CheckpointError("shard " + rel + " was not written");
        files[rel] = {{"bytes", sizes[r].item<int64_t>()},
                      {"fnv1a64", fmt::format("{:016x}", uint64_t(hashes[r].item<int64_t>()))}};
      }
      const nlohmann::json metadata = checkpoint_metadata(iteration, layout, files);
      // metadata.json last: its presence marks the folder complete (checkpoint_files.h).
      write_text_atomically((tmp_dir / "metadata.json").string(), metadata.dump(2));
      commit = commit_checkpoint(dir, iteration);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  groups.host_world().barrier();
  if (!error.empty()) throw CheckpointError("saving checkpoint " + final_dir.string() + ": " + error);
  return commit;
}

std::optional<int64_t> latest_checkpoint(const std::string& dir) {
  const fs::path tracker = fs::path(dir) / kTracker;
  if (!fs::exists(tracker)) return std::nullopt;
  std::ifstream in(tracker);
  char text[64] = {};
  in.read(text, sizeof text - 1);  // a tracker is one number: never read a huge file whole
  const int64_t iteration = parse_tracker(std::string(text, static_cast<size_t>(in.gcount())), tracker.string());
  if (!fs::exists(fs::path(dir) / iteration_dir_name(iteration) / "metadata.json")) {
    throw CheckpointError(tracker.string() + " names iteration " + std::to_string(iteration) + " but " +
                          (fs::path(dir) / iteration_dir_name(iteration) / "metadata.json").string() +
                          " does not exist");
  }
  return iteration;
}

nlohmann::json read_checkpoint_metadata(const std::string& dir, int64_t iteration) {
  const fs::path meta_path = fs::path(dir) / iteration_dir_name(iteration) / "metadata.json";
  std::ifstream in(meta_path, std::ios::binary);
  if (!in) throw CheckpointError(meta_path.string() + " is missing or unreadable");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_checkpoint_metadata(text.str(), meta_path.string());
}

RankCheckpoint read_checkpoint_shard(const std::string& dir, int64_t iteration,
                                     const std::string& rel, const nlohmann::json& metadata, ShardParts parts) {
  const fs::path iter_dir = fs::path(dir) / iteration_dir_name(iteration);
  const fs::path file = iter_dir / rel;
  auto files = metadata.value("files", nlohmann::json::object());
  if (!files.contains(rel)) {
    throw CheckpointError((iter_dir / "metadata.json").string() + " lists no shard " + rel);
  }
  const std::shared_ptr<const MappedShard> bytes = MappedShard::open(file.string());
  const auto want_bytes = files[rel].value("bytes", int64_t(-1));
  if (static_cast<int64_t>(bytes->size()) != want_bytes) {
    throw CheckpointError(fmt::format("checkpoint shard {} is truncated or altered: {} bytes, "
                                      "metadata.json says {}",
                                      file.string(), bytes->size(), want_bytes));
  }
  // The whole file, optimizer state included, whatever `parts` returns: the digest is of the file.
  if (fmt::format("{:016x}", fnv1a64(bytes->data(), bytes->size())) != files[rel].value("fnv1a64", "")) {
    throw CheckpointError("checkpoint shard " + file.string() +
                          " is corrupt: its content hash differs from metadata.json");
  }
  c10::IValue top;
  try {
    top = unpickle_in_place(bytes);
  } catch (const std::exception& e) {
    throw CheckpointError("checkpoint shard " + file.string() + " cannot be read: " + e.what());
  }
  if (!top.isGenericDict()) throw CheckpointError(file.string() + ": not a dictionary");
  auto d = top.toGenericDict();
  for (const char* key : {"model", "optimizer", "meta"}) {
    if (!d.contains(key)) throw CheckpointError(file.string() + ": no '" + key + "' entry");
  }
  if (!d.at("meta").isString()) throw CheckpointError(file.string() + ": 'meta' is not a JSON string");
  RankCheckpoint out;
  out.model = tensor_map(d.at("model"), file.string(), "model");
  if (parts == ShardParts::kAll) out.optimizer = tensor_map(d.at("optimizer"), file.string(), "optimizer");
  try {
    auto meta = nlohmann::json::parse(d.at("meta").toStringRef());
    out.shard_info = meta.value("shards", nlohmann::json::object());
    out.values = meta.value("values", nlohmann::json::object());
  } catch (const std::exception& e) {
    throw CheckpointError(file.string() + ": 'meta' is not valid JSON: " + e.what());
  }
  return out;
}

RankCheckpoint load_checkpoint(const std::string& dir, int64_t iteration,
                               const CheckpointLayout& expected, runtime::ProcessGroups& groups) {
  const fs::path iter_dir = fs::path(dir) / iteration_dir_name(iteration);
  const nlohmann::json metadata = read_checkpoint_metadata(dir, iteration);
  const nlohmann::json have = metadata.value("layout", nlohmann::json::object());
  const nlohmann::json want = layout_json(expected);
  for (const char* key : {"tensor_model_parallel_size", "pipeline_model_parallel_size",
                          "virtual_pipeline_model_parallel_size"}) {
    if (have.value(key, -1) != want[key].get<int>()) {
      throw CheckpointError(fmt::format(
          "checkpoint {} was saved with {} = {}, this run uses {} (resharding is not supported yet)",
          iter_dir.string(), key, have.value(key, nlohmann::json()).dump(), want[key].dump()));
    }
  }
  if (have.value("model", nlohmann::json()) != want["model"]) {
    throw CheckpointError("checkpoint " + iter_dir.string() + " holds a model of shape " +
                          have.value("model", nlohmann::json()).dump() + ", this run builds " +
                          want["model"].dump());
  }
  const std::vector<int64_t> saved_stages = saved_stage_layers(have, expected.model_shape.num_layers);
  if (!expected.stage_layers.empty() && saved_stages != expected.stage_layers) {
    throw CheckpointError(fmt::format(
        "checkpoint {} holds pipeline stages of [{}] layers, this run splits them [{}] "
        "(model.num_layers_in_first_pipeline_stage / num_layers_in_last_pipeline_stage differ); set the "
        "checkpoint's split in the recipe, or rewrite it with `loom convert --checkpoint RUN --output RUN2 "
        "--first-stage-layers N|even --last-stage-layers N|even`",
        iter_dir.string(), fmt::join(saved_stages, ", "), fmt::join(expected.stage_layers, ", ")));
  }
  const auto coords = groups.coords();
  const std::string rel =
      model_parallel_dir_name(coords.tp, coords.pp, groups.layout().pipeline_parallel()) + "/" +
      kShardFile;
  return read_checkpoint_shard(dir, iteration, rel, metadata);
}

}  // namespace loom::train
