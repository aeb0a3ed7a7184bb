// Inference forward passes with a key/value cache (kv_cache.h): the same layers and ops as the
// training forward, minus dropout and autograd, on n new positions at a time.
#include <ATen/ATen.h>

#include <cmath>
#include <stdexcept>

#include "loom_ops/ops.h"
#include "model/attention.h"
#include "model/embedding.h"
#include "model/gpt_stage.h"
#include "model/kv_cache.h"
#include "model/layer_norm.h"
#include "model/lora_serving.h"
#include "model/mappings.h"
#include "model/rotary.h"
#include "model/transformer_layer.h"

namespace loom::model {

std::pair<at::Tensor, at::Tensor> ParallelAttention::forward_cached(const at::Tensor& x, KvCache& cache,
                                                                    const RotaryTables& rotary,
                                                                    const LoraBatch* served) const {
  // q [b, a/t, n, d]; k, v [b, g/t, n, d]: the cache holds the K/V heads only.
  auto [q, k, v] = project_qkv(x, rotary, nullptr, served);
  const int64_t b = q.size(0), heads_local = q.size(1), n = q.size(2), d = q.size(3);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  // Stores this call's keys and values, then the causal attention over every cached position
  // (contiguous: QKᵀ, the offset causal or per-row mask, softmax, ×V; paged: loom::ops::
  // paged_attention through the rows' block tables).
  at::Tensor context = cache.attend(layer_, q, k, v, scale);  // [b, a/t, n, d]
  context = context.permute({2, 0, 1, 3}).reshape({n, b, heads_local * d});
  return proj_.forward(context, nullptr, served);
}

at::Tensor TransformerLayer::forward_cached(const at::Tensor& x, KvCache& cache, const RotaryTables& rotary,
                                            const LoraBatch* served) const {
  DropoutContext off;
  off.training = false;  // p = 0 everywhere
  const int64_t n = x.size(0), b = x.size(1);
  auto no_dropout = [&](uint32_t site) {
    return off.hidden(0.0, layer_, site, n, 0, b, config_.hidden_size);
  };
  auto [attn, attn_bias] = attention_.forward_cached(ln1_.forward(x), cache, rotary, served);
  at::Tensor h = ops::bias_dropout_add(attn, optional_bias(attn_bias), x,
                                       no_dropout(ops::kDropoutSiteAttentionOutput));
  auto [mlp, mlp_bias] = mlp_.forward(ln2_.forward(h), nullptr, served);
  return ops::bias_dropout_add(mlp, optional_bias(mlp_bias), h, no_dropout(ops::kDropoutSiteMlpOutput));
}

KvCache GptStage::make_kv_cache(int64_t batch, int64_t capacity) const {
  const ParamList params = parameters();
  if (params.empty()) throw std::invalid_argument("GptStage::make_kv_cache: the stage is empty");
  const at::Tensor& any = params.front().tensor;
  return KvCache(layout_.first_layer, num_local_layers(), batch,
                 config_.query_groups() / tp_->size(), config_.head_dim(), capacity,
                 at::TensorOptions().dtype(any.scalar_type()).device(any.device()));
}

at::Tensor GptStage::forward_cached(const at::Tensor& input, KvCache& cache, const PromptSplice& prompt,
                                    const at::Tensor& output_rows, const LoraBatch& served) const {
  if (config_.layout.sequence_parallel)
    throw std::invalid_argument(
        "GptStage::forward_cached: inference runs without sequence parallelism; build the "
        "stage with layout.sequence_parallel = false");
  // A first stage takes tokens [b, n]; a later pipeline stage the hidden tensor [n, b, h].
  const bool tokens_in = layout_.pre_process;
  const int64_t b = tokens_in ? input.size(0) : input.size(1);
  const int64_t n = tokens_in ? input.size(1) : input.size(0);
  const bool shape_ok = tokens_in ? input.dim() == 2 : input.dim() == 3 && input.size(2) == config_.hidden_size;
  if (!shape_ok || b != cache.batch() || n < 1)
    throw std::invalid_argument(
        "GptStage::forward_cached: expected " +
        std::string(tokens_in ? "tokens [" : "hidden [n >= 1, ") + std::to_string(cache.batch()) +
        (tokens_in ? ", n >= 1]" : ", " + std::to_string(config_.hidden_size) + "]") + ", found " +
        c10::str(input.sizes()));
  const int64_t end = cache.end_position(n);  // flat batches: each row's own new positions
  if (end > config_.max_position_embeddings)
    throw std::invalid_argument("GptStage::forward_cached: positions up to " +
                                std::to_string(end) + " exceed max_position_embeddings " +
                                std::to_string(config_.max_position_embeddings));
  at::NoGradGuard no_grad;
  const at::Device device = tokens_in ? embedding_->word_weight().device() : input.device();
  // Every stage's new positions: each selected row continues from its own length.
  const at::Tensor positions = cache.positions(n, at::TensorOptions().dtype(at::kLong).device(device));  // [b, n]
  at::Tensor x;
  if (tokens_in) {
    const at::Tensor ids = input.to(device, at::kLong);
    DropoutContext off;
    off.training = false;
    x = embedding_->forward(ids, positions, off, prompt);  // [n, b, h]
  } else {
    x = input;
  }
  const RotaryTables rotary =
      config_.position_embedding_type == PositionEmbedding::kRope
          ? rotary_tables(positions, config_, x.scalar_type())
          : RotaryTables{};
  for (const auto& layer : layers_) x = layer->forward_cached(x, cache, rotary, served.active() ? &served : nullptr);
  cache.advance(n);
  if (!layout_.post_process) return x;
  if (output_rows.defined()) x = x.index_select(0, output_rows);  // [m, b, h]: the head runs on these only
  x = final_ln_->forward(x);
  return at::linear(copy_to_tensor_model_parallel_region(x, tp_), output_weight());
}

}  // namespace loom::model
