#include "convert/checkpoint_writer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <filesystem>

#include "convert/convert_error.h"
#include "launch/file_util.h"
#include "model/gpt_stage.h"
#include "model/init.h"
#include "runtime/communicator.h"
#include "train/checkpoint_files.h"
#include "train/checkpoint_serialize.h"

namespace fs = std::filesystem;

namespace loom::convert {

CheckpointWriter::CheckpointWriter(std::string checkpoints, int64_t iteration, train::CheckpointLayout layout)
    : checkpoints_(std::move(checkpoints)), iteration_(iteration), layout_(std::move(layout)) {
  tmp_dir_ = (fs::path(checkpoints_) / (train::iteration_dir_name(iteration_) + ".tmp")).string();
  fs::create_directories(checkpoints_);
  launch::remove_tree(tmp_dir_);  // a conversion that died half-way
  fs::create_directories(tmp_dir_);
}

void CheckpointWriter::write_rank(int tp, int pp, const train::RankCheckpoint& state) {
  const std::string rel =
      train::model_parallel_dir_name(tp, pp, layout_.parallel.pp) + "/" + train::kShardFileName;
  const std::vector<char> bytes = train::serialize_rank_checkpoint(state, iteration_);
  fs::create_directories((fs::path(tmp_dir_) / rel).parent_path());
  train::write_file_durably((fs::path(tmp_dir_) / rel).string(), bytes.data(), bytes.size());
  files_[rel] = train::shard_file_record(bytes);
}

train::CommitResult CheckpointWriter::commit() {
  const size_t want = static_cast<size_t>(layout_.parallel.tp) * layout_.parallel.pp;
  if (files_.size() != want)
    throw std::logic_error(fmt::format("CheckpointWriter: {} of {} shards written", files_.size(), want));
  train::write_text_atomically((fs::path(tmp_dir_) / "metadata.json").string(),
                               train::checkpoint_metadata(iteration_, layout_, files_).dump(2));
  return train::commit_checkpoint(checkpoints_, iteration_);
}

std::vector<ParamSpec> stage_param_specs(const model::GptConfig& config, int t, int p, int v, int pp) {
  std::vector<model::StageChunk> chunks;
  try {
    config.validate(t);
    chunks = model::pipeline_stage_layouts(config, p, v, pp);
  } catch (const std::invalid_argument& e) {
    throw ConvertInputError(fmt::format("the model does not fit t={} p={} v={}: {}", t, p, v, e.what()));
  }
  model::GptConfig shapes = config;
  shapes.layout.sequence_parallel = false;  // shapes only: t = 1 on the meta device
  std::vector<ParamSpec> out;
  for (const auto& layout : chunks) {
    const model::GptStage stage(shapes, runtime::Communicator::solo(), layout, at::Device(at::kMeta));
    for (const auto& param : stage.parameters()) {
      ParamSpec spec;
      spec.name = param.name;
      spec.global_shape = param.tensor.sizes().vec();
      spec.partition_dim = param.partition_dim;
      spec.tied_copy = param.shared_duplicate;
      spec.word_embedding = param.word_embedding;
      // Vocabulary rows (the word embedding, an untied output layer) padded for t, not for the
      // meta stage's t = 1.
      if (param.word_embedding || param.name == "output_layer.weight") spec.global_shape[0] = config.padded_vocab_size(t);
      out.push_back(std::move(spec));
    }
  }
  return out;
}

nlohmann::json shard_record(const ParamSpec& spec, int tp, int t) {
  std::vector<int64_t> offset(spec.global_shape.size(), 0);
  if (spec.partition_dim >= 0) offset[spec.partition_dim] = spec.global_shape[spec.partition_dim] / t * tp;
  return {{"global_shape", spec.global_shape}, {"offset", offset}};
}

void add_fresh_parameter(train::RankCheckpoint& state, const std::string& name, const at::Tensor& local,
                         const nlohmann::json& shard) {
  state.model[name] = local;
  state.shard_info[name] = shard;
  state.optimizer["main/" + name] = local.to(at::kFloat).clone();
  state.optimizer["exp_avg/" + name] = at::zeros_like(local, local.options().dtype(at::kFloat));
  state.optimizer["exp_avg_sq/" + name] = at::zeros_like(local, local.options().dtype(at::kFloat));
}

nlohmann::json fresh_training_values() {
  return {{"optimizer", {{"name", "adamw"}, {"step", 0}}},
          {"scheduler", {{"step", 0}}},
          {"scaler", nullptr},
          {"iteration", 0},
          {"consumed_samples", 0}};
}

void write_fresh_ranks(CheckpointWriter& writer, const Layout& layout, const model::GptConfig& config,
                       const std::map<std::string, at::Tensor>& params) {
  const at::ScalarType dtype = model::scalar_type(config.params_dtype);
  for (int pp = 0; pp < layout.pp; ++pp) {
    const std::vector<ParamSpec> specs = stage_param_specs(config, layout.tp, layout.pp, layout.vp, pp);
    for (int tp = 0; tp < layout.tp; ++tp) {
      train::RankCheckpoint state;
      for (const auto& spec : specs) {
        const at::Tensor& full = params.at(spec.tied_copy ? "embedding.word_embeddings.weight" : spec.name);
        at::Tensor local = spec.partition_dim >= 0 ? model::shard(full, spec.partition_dim, tp, layout.tp) : full.clone();
        add_fresh_parameter(state, spec.name, local.to(dtype), shard_record(spec, tp, layout.tp));
      }
      state.values = fresh_training_values();
      writer.write_rank(tp, pp, state);
    }
  }
}

}  // namespace loom::convert
