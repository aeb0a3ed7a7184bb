#include "generate/checkpoint_reader.h"

#include "rules/lora_record_key.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <vector>

#include "launch/file_util.h"
#include "rules/model_shape_json.h"

namespace fs = std::filesystem;

namespace loom::generate {

using train::CheckpointError;

namespace {

constexpr const char* kTracker = "latest_checkpointed_iteration.txt";
constexpr const char* kShardFile = "model_optim_rng.pt";
// The last pipeline stage's copy of the tied word embedding (GptStage::parameters()).
constexpr const char* kOutputWordCopy = "output_layer.weight";

bool has_iteration_dirs(const fs::path& dir) {
  std::vector<std::string> names;
  try {
    names = launch::list_directory(dir.string());
  } catch (const std::exception&) {
    return false;
  }
  for (const auto& name : names) {
    if (name.rfind("iter_", 0) == 0 && name.find('.') == std::string::npos &&
        fs::is_directory(dir / name))
      return true;
  }
  return false;
}

int json_int(const nlohmann::json& j, const char* key, const fs::path& file) {
  if (!j.contains(key) || !j[key].is_number_integer())
    throw CheckpointError(file.string() + ": layout." + key + " is missing or not an integer");
  return j[key].get<int>();
}

std::vector<int64_t> json_shape(const nlohmann::json& j, const std::string& what) {
  if (!j.is_array()) throw CheckpointError(what + " is not a list of integers");
  std::vector<int64_t> out;
  for (const auto& x : j) {
    if (!x.is_number_integer()) throw CheckpointError(what + " is not a list of integers");
    out.push_back(x.get<int64_t>());
  }
  return out;
}

struct Shard {
  std::map<std::string, at::Tensor> model;
  nlohmann::json shards;  // name -> {"global_shape", "offset"}
};

Shard read_shard(const std::string& checkpoints, int64_t iteration, const std::string& rel,
                 const nlohmann::json& metadata) {
  train::RankCheckpoint shard =
      train::read_checkpoint_shard(checkpoints, iteration, rel, metadata, train::ShardParts::kModel);
  return {std::move(shard.model), std::move(shard.shard_info)};
}

// A parameter's global tensor being filled from shards.
struct Assembly {
  at::Tensor full;
  std::set<std::vector<int64_t>> offsets;  // shards placed (replicas share an offset)
  int64_t covered = 0;                     // elements placed
};

void place(std::map<std::string, Assembly>& params, const std::string& name,
           const at::Tensor& value, const nlohmann::json& record, const std::string& file) {
  const std::string what = file + ": shard record of " + name;
  if (!record.is_object() || !record.contains("global_shape") || !record.contains("offset"))
    throw CheckpointError(what + " lacks global_shape/offset");
  const auto shape = json_shape(record["global_shape"], what + ".global_shape");
  const auto offset = json_shape(record["offset"], what + ".offset");
  if (shape.size() != static_cast<size_t>(value.dim()) || offset.size() != shape.size())
    throw CheckpointError(fmt::format("{}: a {}-d shard with a {}-d global shape / offset", what,
                                      value.dim(), shape.size()));
  for (size_t i = 0; i < shape.size(); ++i) {
    if (offset[i] < 0 || offset[i] + value.size(i) > shape[i])
      throw CheckpointError(fmt::format("{}: shard [{}] at offset [{}] does not fit [{}]", what,
                                        fmt::join(value.sizes(), ", "), fmt::join(offset, ", "),
                                        fmt::join(shape, ", ")));
  }
  Assembly& a = params[name];
  if (!a.full.defined() && value.sizes().vec() == shape) {
    a.full = value;  // the whole parameter in one shard (t = 1): used as read, not copied
    a.offsets.insert(offset);
    a.covered = value.numel();
    return;
  }
  if (!a.full.defined()) {
    a.full = at::zeros(shape, value.options());
  } else if (a.full.sizes().vec() != shape) {
    throw CheckpointError(fmt::format("{}: global shape [{}] differs from another shard's [{}]",
                                      what, fmt::join(shape, ", "),
                                      fmt::join(a.full.sizes(), ", ")));
  }
  if (!a.offsets.insert(offset).second) return;  // a replica of a shard already placed
  at::Tensor dst = a.full;
  for (size_t i = 0; i < shape.size(); ++i) dst = dst.narrow(i, offset[i], value.size(i));
  dst.copy_(value);
  a.covered += value.numel();
}

}  // namespace

CheckpointLocation locate_checkpoint(const std::string& dir) {
  const fs::path d(dir);
  if (!fs::is_directory(d))
    throw CheckpointError("checkpoint directory " + dir + " does not exist or is not a directory");
  if (fs::is_directory(d / "checkpoints"))
    return {(d / "checkpoints").string(), d.string()};
  if (fs::exists(d / kTracker) || has_iteration_dirs(d)) {
    const fs::path parent = fs::absolute(d).lexically_normal().parent_path();
    const bool run = fs::exists(parent / "config.yaml");
    return {d.string(), run ? parent.string() : std::string()};
  }
  if (fs::exists(d / "config.yaml"))
    throw CheckpointError("run directory " + dir + " has no checkpoints/ folder (yet)");
  throw CheckpointError("no checkpoint in " + dir +
                        ": expected a run directory with checkpoints/ or a checkpoints directory "
                        "with " + kTracker + " or iter_* folders");
}

void refuse_adapter_checkpoint(const CheckpointInfo& info, const std::string& checkpoint) {
  if (info.layout.task_record.is_object() && info.layout.task_record.contains(kLoraRecordKey))
    throw CheckpointError(fmt::format("{} iteration {} is a LoRA adapter checkpoint of loom finetune (adapters only): "
                                      "merge them into their base first: loom convert --merge-lora --checkpoint {} "
                                      "--output RUN",
                                      checkpoint, info.iteration, checkpoint));
}

CheckpointInfo read_checkpoint_info(const std::string& checkpoints,
                                    std::optional<int64_t> iteration) {
  CheckpointInfo info;
  if (iteration) {
    info.iteration = *iteration;
  } else {
    auto latest = train::latest_checkpoint(checkpoints);
    if (!latest)
      throw CheckpointError("no " + (fs::path(checkpoints) / kTracker).string() +
                            ": name the iteration to load");
    info.iteration = *latest;
  }
  const fs::path iter_dir = fs::path(checkpoints) / train::iteration_dir_name(info.iteration);
  const fs::path meta_path = iter_dir / "metadata.json";
  if (!fs::is_directory(iter_dir))
    throw CheckpointError("checkpoint iteration " + std::to_string(info.iteration) +
                          " does not exist: no folder " + iter_dir.string());
  info.metadata = train::read_checkpoint_metadata(checkpoints, info.iteration);
  const nlohmann::json layout = info.metadata.value("layout", nlohmann::json());
  if (!layout.is_object()) throw CheckpointError(meta_path.string() + ": no \"layout\" object");
  info.layout.parallel.tp = json_int(layout, "tensor_model_parallel_size", meta_path);
  info.layout.parallel.pp = json_int(layout, "pipeline_model_parallel_size", meta_path);
  info.layout.parallel.vp = json_int(layout, "virtual_pipeline_model_parallel_size", meta_path);
  info.layout.parallel.dp = json_int(layout, "data_parallel_size", meta_path);
  if (info.layout.parallel.tp < 1 || info.layout.parallel.pp < 1)
    throw CheckpointError(meta_path.string() + ": layout sizes must be >= 1");
  const nlohmann::json model = layout.value("model", nlohmann::json());
  if (!model.is_object()) throw CheckpointError(meta_path.string() + ": layout.model is missing");
  try {
    info.layout.model_shape = model_shape_from_json(model, meta_path.string());
  } catch (const std::invalid_argument& e) {
    throw CheckpointError(e.what());
  }
  // The rest of layout.model is what the training task recorded beside the shape.
  info.layout.task_record = model;
  const nlohmann::json shape_keys = model_shape_to_json(info.layout.model_shape);
  for (const auto& item : shape_keys.items()) info.layout.task_record.erase(item.key());
  if (!info.metadata.value("files", nlohmann::json()).is_object())
    throw CheckpointError(meta_path.string() + ": no \"files\" object");
  return info;
}

FullCheckpoint read_full_checkpoint(const std::string& checkpoints, const CheckpointInfo& info) {
  const fs::path iter_dir = fs::path(checkpoints) / train::iteration_dir_name(info.iteration);
  const int t = info.layout.parallel.tp, p = info.layout.parallel.pp;
  std::map<std::string, Assembly> assembled;
  for (int pp = 0; pp < p; ++pp) {
    for (int tp = 0; tp < t; ++tp) {
      const std::string rel = train::model_parallel_dir_name(tp, pp, p) + "/" + kShardFile;
      Shard shard = read_shard(checkpoints, info.iteration, rel, info.metadata);
      const std::string file = (iter_dir / rel).string();
      for (const auto& [name, value] : shard.model) {
        // The tied copy only: an untied output layer (Llama) is a parameter of its own.
        if (name == kOutputWordCopy && info.layout.model_shape.share_embeddings_and_output_weights) continue;
        if (!shard.shards.contains(name))
          throw CheckpointError(file + ": no shard record (global_shape/offset) for " + name);
        place(assembled, name, value, shard.shards[name], file);
      }
    }
  }
  FullCheckpoint out;
  out.info = info;
  for (auto& [name, a] : assembled) {
    if (a.covered != a.full.numel())
      throw CheckpointError(fmt::format(
          "checkpoint {}: the shards of {} cover {} of its {} elements", iter_dir.string(), name,
          a.covered, a.full.numel()));
    out.params[name] = std::move(a.full);
  }
  return out;
}

}  // namespace loom::generate
