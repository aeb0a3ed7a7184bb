// Helpers of the generation tests: a tiny GPT whose every parameter (biases and LayerNorms
// included) holds a known non-trivial value that depends only on the parameter's name and
// global shape, so a model of any layout can be set to the same "truth", and writing that
// model as a training checkpoint under any (t, p, v).
#pragma once
#include <ATen/ATen.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "launch/file_util.h"
#include "model/gpt_stage.h"
#include "model/init.h"
#include "model/kv_cache.h"
#include "runtime/process_groups.h"
#include "train/checkpoint.h"

namespace loom::generate::test {

inline model::GptConfig tiny_config(int64_t vocab = 100) {
  model::GptConfig c;
  c.num_layers = 4;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = vocab;  // 100 is padded to 128: pad rows exist on the last TP rank
  c.max_position_embeddings = 24;
  c.seq_length = 24;
  c.hidden_dropout = 0.0;
  c.attention_dropout = 0.0;
  c.seed = 42;
  return c;
}

/// The global value of parameter `name` of global shape `shape`: N(0, 0.3²) (LayerNorm
/// weights 1 + N(0, 0.1²)); word-embedding rows past `vocab` are zero.
inline at::Tensor truth_value(const std::string& name, const std::vector<int64_t>& shape,
                              int64_t vocab, bool word_embedding) {
  const bool ln_weight = name.find("layernorm.weight") != std::string::npos;
  at::Tensor v = model::full_normal(777, word_embedding ? "word" : name, shape, ln_weight ? 0.1 : 0.3);
  if (ln_weight) v += 1.0;
  if (word_embedding && shape[0] > vocab) v.narrow(0, vocab, shape[0] - vocab).zero_();
  return v;
}

inline std::vector<int64_t> global_shape(const model::Param& p, int t) {
  std::vector<int64_t> shape = p.tensor.sizes().vec();
  if (p.tensor_parallel()) shape[p.partition_dim] *= t;
  return shape;
}

/// Sets every parameter of `stage` (TP rank `rank` of `t`) to its slice of the truth.
inline void set_truth(const model::GptStage& stage, int rank, int t) {
  at::NoGradGuard no_grad;
  for (const auto& p : stage.parameters()) {
    at::Tensor full = truth_value(p.name, global_shape(p, t), stage.config().vocab_size,
                                  p.word_embedding);
    p.tensor.copy_(p.tensor_parallel() ? model::shard(full, p.partition_dim, rank, t) : full);
  }
}

/// Collective over `groups`: builds this rank's chunks of the truth model for the groups'
/// (t, p) and `v` virtual stages and saves them as iteration `iteration` in `dir`, with shard
/// records exactly as the trainer writes them.
inline void save_truth_checkpoint(const std::string& dir, int64_t iteration,
                                  const model::GptConfig& config, int v,
                                  runtime::ProcessGroups& groups) {
  const int t = groups.layout().tensor_parallel(), p = groups.layout().pipeline_parallel();
  const auto coords = groups.coords();
  train::RankCheckpoint state;
  for (const auto& layout : model::pipeline_stage_layouts(config, p, v, coords.pp)) {
    model::GptStage stage(config, groups.tensor_ptr(), layout);
    set_truth(stage, coords.tp, t);
    for (const auto& prm : stage.parameters()) {
      state.model[prm.name] = prm.tensor.detach().clone();
      std::vector<int64_t> offset(prm.tensor.dim(), 0);
      if (prm.tensor_parallel()) offset[prm.partition_dim] = prm.tensor.size(prm.partition_dim) * coords.tp;
      state.shard_info[prm.name] = {{"global_shape", global_shape(prm, t)}, {"offset", offset}};
    }
  }
  state.values = {{"iteration", iteration}};
  train::CheckpointLayout layout;
  layout.parallel.tp = t;
  layout.parallel.pp = p;
  layout.parallel.vp = v;
  layout.parallel.dp = groups.layout().data_parallel();
  layout.model_shape = config;
  train::save_checkpoint(dir, iteration, layout, state, groups);
}

/// A fresh empty directory under the system temporary directory.
inline std::string temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("loom_test_generate_" + name + "_" + std::to_string(::getpid()));
  launch::remove_tree(dir.string());
  std::filesystem::create_directories(dir);
  return dir.string();
}

/// Copies directory `from` to the new path `to`, recursively (launch::list_directory: see
/// docs/architecture.md on std::filesystem's iteration in binaries linked to libtorch).
inline void copy_tree(const std::string& from, const std::string& to) {
  std::filesystem::create_directories(to);
  for (const auto& name : launch::list_directory(from)) {
    const std::string src = from + "/" + name, dst = to + "/" + name;
    if (std::filesystem::is_directory(src)) {
      copy_tree(src, dst);
    } else {
      std::filesystem::copy_file(src, dst);
    }
  }
}

/// max |a - b| / max |b|.
inline double rel_err(const at::Tensor& a, const at::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1e-30);
  return (a - b).abs().max().item<double>() / scale;
}

}  // namespace loom::generate::test
