// Checkpoints in Megatron's legacy layout (docs/design/formats.md, "Checkpoints"):
//   <dir>/latest_checkpointed_iteration.txt        the iteration, written last
//   <dir>/iter_0000100/metadata.json              layout, sizes, and every shard's size and hash
//   <dir>/iter_0000100/mp_rank_TT[_PPP]/model_optim_rng.pt
// One shard per model-parallel rank (tensor rank TT, pipeline stage PPP when p > 1), written by
// data-parallel rank 0: a torch.save-compatible pickle (torch.load reads it) of
//   {"model": {name: this rank's shard}, "optimizer": {key: fp32 whole-parameter state},
//    "meta": JSON text with each tensor's global shape and offset, the optimizer, scheduler and
//    loss-scaler values, and the training position}.
// Saving is atomic for readers: shards go to iter_N.tmp/, rank 0 checks every shard's size and
// hash, writes metadata.json and commits the folder with a journal (checkpoint_files.h). A rank
// killed mid-save leaves the previous checkpoint as the one that loads; a kill during the
// commit is finished on the next start.
#pragma once
#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "rules/layout.h"
#include "rules/model_shape.h"
#include "runtime/process_groups.h"
#include "train/checkpoint_files.h"

namespace loom::train {

/// What a checkpoint records of the run that wrote it; loading needs the same t, p, v (d may
/// differ: optimizer state is stored per whole parameter).
struct CheckpointLayout {
  /// The run's layout: tp, pp, vp, dp and the uneven end stages are written (null: an even
  /// share); the batch and recompute fields are not part of a checkpoint.
  Layout parallel;
  /// The model's shape, written as layout.model (rules/model_shape_json.h; must match too).
  ModelShape model_shape;
  /// What a training task records beside the shape, as more keys of layout.model (prompt
  /// learning: "prompt_learning", its base and what it trains); empty for pretraining. A resume
  /// needs the same.
  nlohmann::json task_record = nlohmann::json::object();
  /// Transformer layers of each pipeline stage (p entries; rules::stage_layer_counts). A resume
  /// needs the same stage_layers.
  std::vector<int64_t> stage_layers;

  /// layout.model as metadata.json holds it: model_shape_to_json(model_shape) and task_record's keys.
  nlohmann::json model_json() const;
};

/// What one model-parallel rank saves and restores.
struct RankCheckpoint {
  std::map<std::string, at::Tensor> model;      ///< parameter name → this rank's shard
  /// Per parameter: {"global_shape": [...], "offset": [...]} (where the shard sits).
  nlohmann::json shard_info = nlohmann::json::object();
  std::map<std::string, at::Tensor> optimizer;  ///< optimizer state tensors
  nlohmann::json values = nlohmann::json::object();  ///< optimizer/scheduler/scaler/position
};

/// Collective over the world: every rank calls it; data-parallel rank 0 of each model-parallel
/// rank writes `state`, and world rank 0 commits the iteration (checkpoint_files.h: an
/// iteration of an earlier run is kept as iter_N.superseded-K, never overwritten). Throws
/// CheckpointError naming the file on an I/O failure. The result is world rank 0's.
CommitResult save_checkpoint(const std::string& dir, int64_t iteration, const CheckpointLayout& layout,
                             const RankCheckpoint& state, runtime::ProcessGroups& groups);

/// The iteration named by <dir>/latest_checkpointed_iteration.txt, nullopt when there is no
/// tracker. Throws CheckpointError when the tracker is malformed (parse_tracker) or names a
/// missing folder.
std::optional<int64_t> latest_checkpoint(const std::string& dir);

/// <dir>/iter_N/metadata.json, checked by parse_checkpoint_metadata. Throws CheckpointError
/// naming the file when it is missing, not valid JSON or malformed.
nlohmann::json read_checkpoint_metadata(const std::string& dir, int64_t iteration);

/// What read_checkpoint_shard returns of a shard: all of it (resuming training), or the model
/// tensors with their shard records and values, without the optimizer state (inference).
enum class ShardParts { kAll, kModel };

/// One shard of iteration `iteration`, `rel` = "mp_rank_TT[_PPP]/model_optim_rng.pt", checked
/// against `metadata` (read_checkpoint_metadata: listed, same size, same content hash over the
/// whole file, whichever `parts` are returned) and unpickled in place: the tensors view a
/// private copy-on-write mapping of the file (mapped_shard.h), no tensor bytes are copied. Any
/// process may read any shard (generation merges them all). Throws CheckpointError naming the
/// file when it is unlisted, missing, truncated, corrupt or unreadable.
RankCheckpoint read_checkpoint_shard(const std::string& dir, int64_t iteration,
                                     const std::string& rel, const nlohmann::json& metadata,
                                     ShardParts parts = ShardParts::kAll);

/// Loads this rank's shard of iteration `iteration` (every rank reads). Throws CheckpointError
/// naming what differs when the layout or model shape is not `expected`, and naming the file
/// when a shard is missing, truncated or corrupt.
RankCheckpoint load_checkpoint(const std::string& dir, int64_t iteration,
                               const CheckpointLayout& expected, runtime::ProcessGroups& groups);

}  // namespace loom::train
