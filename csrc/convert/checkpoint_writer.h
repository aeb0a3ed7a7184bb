// Writing a Loom training checkpoint offline, one model-parallel rank's shard at a time, in
// the files a training run writes (train/checkpoint.h): shards into <dir>/iter_N.tmp/, then
// metadata.json and the journaled commit (train/checkpoint_files.h), so that a converter
// killed half-way leaves no folder that loads and an earlier iteration of that number is kept
// as iter_N.superseded-K.
#pragma once
#include <nlohmann/json.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/gpt_config.h"
#include "train/checkpoint.h"

namespace loom::convert {

class CheckpointWriter {
 public:
  /// Prepares <checkpoints>/iter_N.tmp (a leftover one is removed).
  CheckpointWriter(std::string checkpoints, int64_t iteration, train::CheckpointLayout layout);
  /// Writes the shard of tensor rank `tp`, pipeline rank `pp`.
  void write_rank(int tp, int pp, const train::RankCheckpoint& state);
  /// Checks every shard of the layout was written, writes metadata.json and commits.
  train::CommitResult commit();

 private:
  std::string checkpoints_, tmp_dir_;
  int64_t iteration_;
  train::CheckpointLayout layout_;
  nlohmann::json files_ = nlohmann::json::object();
};

/// One parameter of a layout's pipeline rank: its name, global shape (the word embedding with
/// the vocabulary padded for that t) and the dimension split over the t ranks (-1: replicated).
/// `tied_copy`: the last stage's own copy of the word embedding ("output_layer.weight").
struct ParamSpec {
  std::string name;
  std::vector<int64_t> global_shape;
  int partition_dim = -1;
  bool tied_copy = false;
  bool word_embedding = false;
};

/// Every parameter of pipeline rank `pp` of (t, p, v), in the stage's order, from the model
/// itself (built on the meta device: no memory). Throws ConvertInputError naming the field when
/// the model does not fit the layout (heads or FFN % t, layers % (p·v)).
std::vector<ParamSpec> stage_param_specs(const model::GptConfig& config, int t, int p, int v, int pp);

/// {"global_shape", "offset"} of tensor rank `tp`'s shard of `spec` (as the trainer records it).
nlohmann::json shard_record(const ParamSpec& spec, int tp, int t);

/// Adds parameter `name` (this rank's shard `local`, where it sits: `shard`, as shard_record
/// gives it) to `state` with a fresh optimizer's state for it (optim/optimizer.h: fp32 main
/// parameter = the weight, zero moments).
void add_fresh_parameter(train::RankCheckpoint& state, const std::string& name, const at::Tensor& local,
                         const nlohmann::json& shard);
/// The position and scalars of a run that has not started: optimizer and scheduler step 0,
/// iteration 0, no samples consumed.
nlohmann::json fresh_training_values();

/// Writes every rank's shard of `layout` (the caller commits): each parameter of
/// stage_param_specs sliced from `params` (full tensors by name, the vocabulary padded for
/// layout.tp; the last stage's tied copy from the embedding) in config's dtype, with a fresh
/// optimizer (fp32 main parameters = the weights, zero moments, step 0) at position 0, so that
/// `loom train` starts from it and `loom generate` reads it. Throws std::out_of_range for a
/// parameter missing from `params`.
void write_fresh_ranks(CheckpointWriter& writer, const Layout& layout, const model::GptConfig& config,
                       const std::map<std::string, at::Tensor>& params);

}  // namespace loom::convert
