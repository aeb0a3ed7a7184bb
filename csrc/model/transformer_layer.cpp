#include "model/transformer_layer.h"

#include <ATen/ATen.h>

#include "loom_ops/ops.h"
#include "model/activation_memory.h"

namespace loom::model {

namespace {
std::string prefix(int layer) { return "layers." + std::to_string(layer) + "."; }
}  // namespace

TransformerLayer::TransformerLayer(const GptConfig& config, int layer, runtime::CommunicatorPtr tp,
                                   const at::TensorOptions& options)
    : config_(config),
      layer_(layer),
      tp_(tp),
      ln1_(prefix(layer) + "input_layernorm", config.hidden_size, config.layernorm_epsilon,
           config.layout.sequence_parallel, options, config.normalization, config.bias,
           config.persist_layer_norm),
      attention_(config, layer, tp, options),
      ln2_(prefix(layer) + "pre_mlp_layernorm", config.hidden_size, config.layernorm_epsilon,
           config.layout.sequence_parallel, options, config.normalization, config.bias,
           config.persist_layer_norm),
      mlp_(config, layer, tp, options) {}

std::optional<at::Tensor> optional_bias(const at::Tensor& bias) {
  if (!bias.defined()) return std::nullopt;
  return bias;
}

at::Tensor TransformerLayer::forward(const at::Tensor& x, const DropoutContext& dropout,
                                     const RotaryTables& rotary, const DocumentMask& document) const {
  ActivationScope scope(layer_);
  const bool sp = config_.layout.sequence_parallel;
  const int64_t s_local = x.size(0), b = x.size(1);
  const int64_t s = sp ? s_local * tp_->size() : s_local;
  const int64_t seq_offset = sp ? tp_->rank() * s_local : 0;
  auto hidden_spec = [&](uint32_t site) {
    return dropout.hidden(config_.hidden_dropout, layer_, site, s, seq_offset, b,
                          config_.hidden_size);
  };

  auto [attn, attn_bias] = attention_.forward(ln1_.forward(x), dropout, rotary, document);
  at::Tensor h = ops::bias_dropout_add(attn, optional_bias(attn_bias), x,
                                       hidden_spec(ops::kDropoutSiteAttentionOutput));
  auto [mlp, mlp_bias] = mlp_.forward(ln2_.forward(h), &dropout);
  return ops::bias_dropout_add(mlp, optional_bias(mlp_bias), h, hidden_spec(ops::kDropoutSiteMlpOutput));
}

void TransformerLayer::collect(ParamList& out) const {
  ln1_.collect(out);
  attention_.collect(out);
  ln2_.collect(out);
  mlp_.collect(out);
}

}  // namespace loom::model
