// Helpers shared by the model tests: a tiny GPT config, deterministic inputs, one training
// forward/backward, and gathering a rank's parameter shards back to full shape.
#pragma once
#include <ATen/ATen.h>

#include <map>
#include <string>

#include "model/gpt_stage.h"
#include "model/mappings.h"
#include "train/optim/grad_buffer.h"
#include "train/optim/grad_finalize.h"

namespace loom::model::test {

inline GptConfig tiny_config() {
  GptConfig c;
  c.num_layers = 3;  // with layout.recompute.num_layers = 2: a chunk that does not divide
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 100;  // padded to 128: pad columns present on the last ranks
  c.max_position_embeddings = 16;
  c.seq_length = 8;
  c.hidden_dropout = 0.0;
  c.attention_dropout = 0.0;
  c.seed = 42;
  return c;
}

/// tiny_config() as a Llama-family decoder: RMSNorm, RoPE, SwiGLU (ffn 48 per gate), 2 K/V
/// heads for 4 query heads, no biases, an untied output layer.
inline GptConfig tiny_llama_config() {
  GptConfig c = tiny_config();
  c.normalization = Normalization::kRmsNorm;
  c.position_embedding_type = PositionEmbedding::kRope;
  c.rotary_base = 500.0;  // short sequences: a small base turns the angles visibly
  c.activation = Activation::kSwiglu;
  c.ffn_hidden_size = 48;
  c.num_query_groups = 2;
  c.bias = false;
  c.share_embeddings_and_output_weights = false;
  c.layernorm_epsilon = 1e-6;
  return c;
}

/// tiny_llama_config() with every further option of the family: Qwen2's QKV-only bias, tied
/// embeddings, heads of kv_channels 16 (a·d = 64 != hidden 32), partial rotary (the leading 8
/// of 16 dimensions) and Llama 3.1's rope scaling with a short original context (so that its
/// three frequency bands all occur).
inline GptConfig tiny_llama_extras_config() {
  GptConfig c = tiny_llama_config();
  c.qkv_bias = true;
  c.share_embeddings_and_output_weights = true;
  c.kv_channels = 16;
  c.rotary_percentage = 0.5;
  c.rope_scaling.enabled = true;
  c.rope_scaling.factor = 4.0;
  c.rope_scaling.old_context_len = 32;
  return c;
}

struct Batch {
  at::Tensor tokens, positions, labels;  // [b, s]
};

inline Batch make_batch(const GptConfig& c, int64_t b, uint64_t seed = 5) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  Batch batch;
  batch.tokens = at::randint(c.vocab_size, {b, c.seq_length}, gen, at::kLong);
  batch.labels = at::randint(c.vocab_size, {b, c.seq_length}, gen, at::kLong);
  batch.positions = at::arange(c.seq_length, at::kLong).unsqueeze(0).expand({b, c.seq_length}).contiguous();
  return batch;
}

struct Result {
  at::Tensor loss;                          ///< per-token loss [b, s], detached
  std::map<std::string, at::Tensor> grads;  ///< full-shape gradients by parameter name
};

/// Full-shape copy of a rank's parameter gradient: shards gathered over `tp`.
inline at::Tensor full_grad(const Param& p, runtime::Communicator& tp) {
  at::Tensor g = p.tensor.grad().detach();
  if (!p.tensor_parallel() || tp.size() == 1) return g.clone();
  return comm::all_gather_dim0(g.movedim(p.partition_dim, 0).contiguous(), tp)
      .movedim(0, p.partition_dim)
      .contiguous();
}

/// The production SP gradient all-reduce (train/optim/grad_finalize.h) on one backward's
/// gradients: through a GradBuffer, as the training step runs it, then back into each .grad.
inline void all_reduce_sequence_parallel_grads(const ParamList& params, runtime::Communicator& tp) {
  train::optim::GradBuffer buffer(params);
  buffer.accumulate();
  train::optim::all_reduce_sequence_parallel_grads(buffer, tp);
  for (size_t i = 0; i < params.size(); ++i)
    params[i].tensor.mutable_grad() = buffer.main_grad(i).to(params[i].tensor.scalar_type(), false, /*copy=*/true);
}

/// Forward, mean loss, backward and the SP gradient all-reduce of one whole-model stage.
inline Result run_step(const GptStage& stage, const Batch& batch, const DropoutContext& dropout,
                       runtime::Communicator& tp) {
  StageInputs in;
  in.tokens = batch.tokens;
  in.position_ids = batch.positions;
  in.labels = batch.labels;
  at::Tensor loss = stage.forward(in, dropout);
  loss.mean().backward();
  auto params = stage.parameters();
  all_reduce_sequence_parallel_grads(params, tp);
  Result r;
  r.loss = loss.detach();
  for (const auto& p : params) r.grads[p.name] = full_grad(p, tp);
  return r;
}

/// max |a - b| / max(max |b|, tiny): the relative error used by the equivalence tests.
inline double rel_err(const at::Tensor& a, const at::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1e-30);
  return (a - b).abs().max().item<double>() / scale;
}

}  // namespace loom::model::test
