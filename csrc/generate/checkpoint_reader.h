// Reading a whole training checkpoint, whatever layout wrote it (docs/design/formats.md, "Checkpoints";
// train/checkpoint.h for the files): every mp_rank_TT[_PPP]/model_optim_rng.pt shard of an
// iteration is checked against metadata.json (size and content hash), and each parameter's
// global tensor is assembled from the shards' {"global_shape", "offset"} records. Pipeline
// stages are merged (names carry the global layer number); the last stage's own copy of the
// tied word embedding ("output_layer.weight") is left out. The result can then be sliced for
// any tensor-parallel size (model_loader.h).
#pragma once
#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "train/checkpoint.h"

namespace loom::generate {

/// Where a checkpoint lives: `checkpoints` holds latest_checkpointed_iteration.txt and the
/// iter_* folders; `run_dir` is the training run directory above it (with config.yaml), or
/// empty when the checkpoints folder was given and its parent holds no config.yaml.
struct CheckpointLocation {
  std::string checkpoints;
  std::string run_dir;
};

/// Accepts a run directory (containing checkpoints/) or a checkpoints directory (containing
/// latest_checkpointed_iteration.txt or iter_* folders). Throws train::CheckpointError naming
/// `dir` and what was looked for otherwise.
CheckpointLocation locate_checkpoint(const std::string& dir);

/// The layout and model shape recorded in <checkpoints>/iter_N/metadata.json.
struct CheckpointInfo {
  int64_t iteration = 0;
  train::CheckpointLayout layout;
  nlohmann::json metadata;  ///< the whole metadata.json
};

/// Reads metadata.json of `iteration` (nullopt: the tracker's latest). Throws
/// train::CheckpointError naming the file when the tracker, folder or metadata is missing or
/// malformed.
CheckpointInfo read_checkpoint_info(const std::string& checkpoints,
                                    std::optional<int64_t> iteration = std::nullopt);

/// Throws train::CheckpointError when `info` is a `loom finetune` adapter checkpoint (adapters
/// only, no model to run), naming `checkpoint` and the command that merges it into its base.
void refuse_adapter_checkpoint(const CheckpointInfo& info, const std::string& checkpoint);

/// Every parameter of the model as one global tensor (CPU, the dtype it was saved in).
struct FullCheckpoint {
  CheckpointInfo info;
  std::map<std::string, at::Tensor> params;
};

/// Reads and merges every model-parallel shard of `info`'s iteration. Throws
/// train::CheckpointError naming the file when a shard is missing, truncated, corrupt
/// (hash), unreadable, or when shards do not tile a parameter's global shape exactly.
FullCheckpoint read_full_checkpoint(const std::string& checkpoints, const CheckpointInfo& info);

}  // namespace loom::generate
