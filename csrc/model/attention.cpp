#include "model/attention.h"

#include <ATen/ATen.h>

#include <cmath>

#include "loom_ops/ops.h"
#include "model/init.h"
#include "model/kv_cache.h"

namespace loom::model {

namespace {
std::string prefix(int layer) { return "layers." + std::to_string(layer) + ".self_attention."; }
double output_std(const GptConfig& c) { return c.init_method_std / std::sqrt(2.0 * c.num_layers); }
int64_t qkv_rows(const GptConfig& c) { return (c.num_attention_heads + 2 * c.query_groups()) * c.head_dim(); }
std::optional<at::Tensor> full_bias(bool present, int64_t size) {
  if (!present) return std::nullopt;
  return at::zeros({size});  // host: full initial values, sharded then moved (init.h)
}
}  // namespace

ParallelAttention::ParallelAttention(const GptConfig& config, int layer,
                                     runtime::CommunicatorPtr tp, const at::TensorOptions& options)
    : config_(config),
      layer_(layer),
      tp_(tp),
      qkv_(prefix(layer) + "linear_qkv",
           full_normal(config.seed, prefix(layer) + "linear_qkv.weight",
                       {qkv_rows(config), config.hidden_size}, config.init_method_std),
           full_bias(config.bias || config.qkv_bias, qkv_rows(config)), tp, config.layout.sequence_parallel, options),
      proj_(prefix(layer) + "linear_proj",
            full_normal(config.seed, prefix(layer) + "linear_proj.weight",
                        {config.hidden_size, config.num_attention_heads * config.head_dim()}, output_std(config)),
            full_bias(config.bias, config.hidden_size).value_or(at::Tensor()), tp, config.layout.sequence_parallel,
            options) {
  qkv_.attach_lora(kLoraAttentionQkv, layer, config.lora, config.seed, options);
  proj_.attach_lora(kLoraAttentionDense, layer, config.lora, config.seed, options);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ParallelAttention::project_qkv(const at::Tensor& x,
                                                                              const RotaryTables& rotary,
                                                                              const DropoutContext* dropout,
                                                                              const LoraBatch* served) const {
  at::Tensor mixed = qkv_.forward(x, /*skip_bias_add=*/false, dropout, served);  // [s, b, (a + 2g)d/t], per group [q heads|k|v]
  const int64_t s = mixed.size(0), b = mixed.size(1);
  const int64_t d = config_.head_dim();
  const int64_t groups_local = config_.query_groups() / tp_->size();
  const int64_t per_group = config_.num_attention_heads / config_.query_groups();  // query heads
  mixed = mixed.view({s, b, groups_local, (per_group + 2) * d});
  // [b, heads, s, d] views of the one QKV tensor.
  at::Tensor q = mixed.narrow(3, 0, per_group * d).reshape({s, b, groups_local * per_group, d}).permute({1, 2, 0, 3});
  at::Tensor k = mixed.narrow(3, per_group * d, d).permute({1, 2, 0, 3});
  at::Tensor v = mixed.narrow(3, (per_group + 1) * d, d).permute({1, 2, 0, 3});
  if (rotary.active()) {
    q = apply_rotary(q, rotary, config_.apply_rope_fusion);
    k = apply_rotary(k, rotary, config_.apply_rope_fusion);
  }
  return {q, k, v};
}

at::Tensor ParallelAttention::expand_groups(const at::Tensor& kv) const {
  return expand_kv_heads(kv, kv.size(1) * (config_.num_attention_heads / config_.query_groups()));
}

std::pair<at::Tensor, at::Tensor> ParallelAttention::forward(const at::Tensor& x, const DropoutContext& dropout,
                                                             const RotaryTables& rotary,
                                                             const DocumentMask& document) const {
  auto [q, k_groups, v_groups] = project_qkv(x, rotary, &dropout);
  const at::Tensor k = expand_groups(k_groups), v = expand_groups(v_groups);
  const int64_t b = q.size(0), heads_local = q.size(1), s = q.size(2), d = q.size(3);

  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  auto spec = dropout.attention(config_.attention_dropout, layer_, b, config_.num_attention_heads,
                                tp_->rank() * heads_local, s);
  // Packed rows: the causal mask AND the same example (document_mask.h).
  const std::optional<at::Tensor> cross_segment =
      document.active() ? std::optional<at::Tensor>(document.cross_segment) : std::nullopt;
  at::Tensor context;
  if (config_.use_flash_attention) {
    // ATen's fused kernel (flash / memory-efficient / cuDNN on CUDA, the flash kernel on CPU):
    // the same softmax(QKᵀ·scale + causal mask)·V without the [b, a/t, s, s] scores. GptConfig
    // rejects attention dropout here (rules::fused_attention_violations), so nothing is drawn.
    // Packed rows pass the causal document mask itself as a bias (SDPA takes a mask or
    // is_causal, not both); the stage's one [b, 1, s, s] bias, still no per-head scores.
    const bool packed = document.active();
    if (packed && !document.sdpa_bias.defined())
      throw std::logic_error("ParallelAttention: a packed micro-batch's mask lacks the SDPA bias");
    context = at::scaled_dot_product_attention(
        q, k, v, packed ? std::optional<at::Tensor>(document.sdpa_bias) : std::nullopt,
        /*dropout_p=*/0.0, /*is_causal=*/!packed, scale);
  } else if (config_.layout.recompute.granularity == RecomputeGranularity::kSelective) {
    context = ops::core_attention(q, k, v, cross_segment, scale, /*causal=*/true, spec);
  } else {
    at::Tensor scores = at::matmul(q, k.transpose(-2, -1));  // [b, a/t, s, s]
    at::Tensor probs = ops::scaled_masked_softmax(scores, cross_segment, scale, /*causal=*/true);
    if (spec.p > 0.0) probs = ops::dropout(probs, spec);
    context = at::matmul(probs, v);
  }
  // [b, a/t, s, d] -> [s, b, a·d/t]
  context = context.permute({2, 0, 1, 3}).reshape({s, b, heads_local * d});
  return proj_.forward(context, &dropout);
}

void ParallelAttention::collect(ParamList& out) const {
  qkv_.collect(out);
  proj_.collect(out);
}

}  // namespace loom::model
