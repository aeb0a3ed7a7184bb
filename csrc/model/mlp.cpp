#include "model/mlp.h"

#include <ATen/ATen.h>

#include <cmath>

#include "loom_ops/ops.h"
#include "model/init.h"

namespace loom::model {

namespace {
std::string prefix(int layer) { return "layers." + std::to_string(layer) + ".mlp."; }
// fc1's output rows: ffn, or gate and up (2·ffn) for the gated MLP.
int64_t fc1_rows(const GptConfig& c) { return c.activation == Activation::kSwiglu ? 2 * c.ffn() : c.ffn(); }
}  // namespace

ParallelMlp::ParallelMlp(const GptConfig& c, int layer, runtime::CommunicatorPtr tp,
                         const at::TensorOptions& options)
    : activation_(c.activation),
      fused_(c.bias_activation_fusion),
      fc1_(prefix(layer) + "linear_fc1",
           full_normal(c.seed, prefix(layer) + "linear_fc1.weight", {fc1_rows(c), c.hidden_size},
                       c.init_method_std),
           c.bias ? std::optional<at::Tensor>(at::zeros({fc1_rows(c)})) : std::nullopt,  // host: (init.h)
           tp, c.layout.sequence_parallel, options),
      fc2_(prefix(layer) + "linear_fc2",
           full_normal(c.seed, prefix(layer) + "linear_fc2.weight", {c.hidden_size, c.ffn()},
                       c.init_method_std / std::sqrt(2.0 * c.num_layers)),
           c.bias ? at::zeros({c.hidden_size}) : at::Tensor(),  // host: as above
           tp, c.layout.sequence_parallel, options) {
  fc1_.attach_lora(kLoraMlpFc1, layer, c.lora, c.seed, options);
  fc2_.attach_lora(kLoraMlpFc2, layer, c.lora, c.seed, options);
}

std::pair<at::Tensor, at::Tensor> ParallelMlp::forward(const at::Tensor& x, const DropoutContext* dropout,
                                                       const LoraBatch* served) const {
  if (activation_ == Activation::kSwiglu) {
    at::Tensor h = fc1_.forward(x, /*skip_bias_add=*/false, dropout, served);  // [s, b, 2·ffn/t], rows interleaved gate, up
    if (fused_) return fc2_.forward(ops::swiglu(h), dropout, served);
    h = h.unflatten(-1, {h.size(-1) / 2, 2});
    return fc2_.forward(at::silu(h.select(-1, 0)) * h.select(-1, 1), dropout, served);
  }
  at::Tensor h = fc1_.forward(x, /*skip_bias_add=*/true, dropout, served);  // [s, b, ffn/t]
  if (!fc1_.bias().defined()) return fc2_.forward(at::gelu(h, "tanh"), dropout, served);
  if (!fused_) return fc2_.forward(at::gelu(h + fc1_.bias(), "tanh"), dropout, served);
  return fc2_.forward(ops::bias_gelu(h, fc1_.bias()), dropout, served);
}

void ParallelMlp::collect(ParamList& out) const {
  fc1_.collect(out);
  fc2_.collect(out);
}

}  // namespace loom::model
