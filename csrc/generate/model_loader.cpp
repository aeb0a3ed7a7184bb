#include "generate/model_loader.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <set>

#include "model/init.h"

namespace loom::generate {

using train::CheckpointError;

namespace {

// The checkpoint's word embedding [V_padded(t_saved), h] re-padded to `padded` rows: real rows
// [0, vocab) kept, pad rows zero (they never reach a real logit or a real token).
at::Tensor repad_vocab(const at::Tensor& full, int64_t vocab, int64_t padded,
                       const std::string& name) {
  if (full.dim() != 2 || full.size(0) < vocab)
    throw CheckpointError(fmt::format("checkpoint parameter {} has shape [{}], expected at least "
                                      "{} rows (the vocabulary)",
                                      name, fmt::join(full.sizes(), ", "), vocab));
  if (full.size(0) == padded) return full;
  at::Tensor out = at::zeros({padded, full.size(1)}, full.options());
  out.narrow(0, 0, vocab).copy_(full.narrow(0, 0, vocab));
  return out;
}

}  // namespace

model::GptConfig inference_config(const ModelShape& model_shape, const InferenceModelOptions& options) {
  model::GptConfig c(model_shape);
  c.make_vocab_size_divisible_by = options.make_vocab_size_divisible_by;
  c.layernorm_epsilon = options.layernorm_epsilon;
  c.hidden_dropout = 0.0;
  c.attention_dropout = 0.0;
  c.layout = Layout{};  // no sequence parallelism, no recomputation, one stage's split
  c.params_dtype = Precision::kFp32;
  return c;
}

std::set<std::string> fill_stage_parameters(const FullCheckpoint& checkpoint,
                                            const model::GptStage& stage, int tp_rank, int tp_size) {
  at::NoGradGuard no_grad;
  std::set<std::string> used;
  for (const auto& p : stage.parameters()) {
    // The last stage's own copy of the tied word embedding is the embedding itself.
    const std::string source = p.shared_duplicate ? "embedding.word_embeddings.weight" : p.name;
    auto it = checkpoint.params.find(source);
    if (it == checkpoint.params.end())
      throw CheckpointError(fmt::format("checkpoint iteration {} has no parameter {}",
                                        checkpoint.info.iteration, source));
    used.insert(source);
    at::Tensor full = it->second;
    if (p.word_embedding)
      full = repad_vocab(full, stage.config().vocab_size, stage.padded_vocab_size(), p.name);
    std::vector<int64_t> want = p.tensor.sizes().vec();
    if (p.tensor_parallel()) want[p.partition_dim] *= tp_size;
    if (full.sizes().vec() != want)
      throw CheckpointError(fmt::format("checkpoint parameter {} has shape [{}], the model [{}]",
                                        source, fmt::join(full.sizes(), ", "),
                                        fmt::join(want, ", ")));
    at::Tensor local = p.tensor_parallel() ? model::shard(full, p.partition_dim, tp_rank, tp_size) : full;
    p.tensor.copy_(local);  // host → the stage's device, in its dtype
  }
  return used;
}

model::GptStage load_stage(const FullCheckpoint& checkpoint, const model::GptConfig& config,
                           runtime::CommunicatorPtr tp, model::StageChunk layout, at::Device device,
                           int tp_rank, int tp_size, std::set<std::string>* used) {
  model::GptStage stage = [&] {
    const model::SkipInitialValues no_draws;
    return model::GptStage(config, std::move(tp), layout, device);
  }();
  std::set<std::string> names = fill_stage_parameters(checkpoint, stage, tp_rank, tp_size);
  if (used) *used = std::move(names);
  return stage;
}

model::GptStage load_inference_model(const FullCheckpoint& checkpoint,
                                     const model::GptConfig& config, runtime::CommunicatorPtr tp,
                                     at::Device device) {
  const int rank = tp->rank(), size = tp->size();
  std::set<std::string> used;
  model::GptStage stage = load_stage(checkpoint, config, std::move(tp), model::StageChunk{}, device, rank, size, &used);
  for (const auto& [name, value] : checkpoint.params) {
    if (!used.count(name))
      throw CheckpointError(fmt::format("checkpoint iteration {} holds parameter {} that a model "
                                        "of its recorded shape does not have",
                                        checkpoint.info.iteration, name));
  }
  return stage;
}

}  // namespace loom::generate
