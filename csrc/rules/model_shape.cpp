#include "rules/model_shape.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace loom {

const char* recipe_name(Normalization n) { return n == Normalization::kRmsNorm ? "rmsnorm" : "layernorm"; }
const char* recipe_name(PositionEmbedding p) { return p == PositionEmbedding::kRope ? "rope" : "learned_absolute"; }
const char* recipe_name(Activation a) { return a == Activation::kSwiglu ? "fast-swiglu" : "gelu"; }

bool RopeScaling::is_default() const {
  const RopeScaling off;
  return enabled == off.enabled && factor == off.factor && low_freq_factor == off.low_freq_factor &&
         high_freq_factor == off.high_freq_factor && old_context_len == off.old_context_len;
}

bool ModelShape::is_gpt() const {
  const ModelShape gpt;
  return normalization == gpt.normalization && position_embedding_type == gpt.position_embedding_type &&
         rotary_base == gpt.rotary_base && rotary_percentage == gpt.rotary_percentage &&
         activation == gpt.activation && query_groups() == num_attention_heads && bias == gpt.bias &&
         qkv_bias == gpt.qkv_bias && kv_channels == gpt.kv_channels && rope_scaling.is_default() &&
         share_embeddings_and_output_weights == gpt.share_embeddings_and_output_weights;
}

int64_t ModelShape::padded_vocab_size(int tensor_parallel) const {
  const int64_t multiple = std::lcm<int64_t>(std::max<int64_t>(1, make_vocab_size_divisible_by),
                                             std::max(1, tensor_parallel));
  return (vocab_size + multiple - 1) / multiple * multiple;
}

void ModelShape::validate() const {
  auto positive = [](const char* field, int64_t value) {
    if (value <= 0)
      throw std::invalid_argument(
          fmt::format("model shape: {} must be a positive integer, found {}", field, value));
  };
  positive("num_layers", num_layers);
  positive("hidden_size", hidden_size);
  positive("num_attention_heads", num_attention_heads);
  positive("seq_length", seq_length);
  positive("vocab_size", vocab_size);
  if (ffn_hidden_size < 0)
    throw std::invalid_argument(
        fmt::format("model shape: ffn_hidden_size must be >= 0 (0 = 4h), found {}", ffn_hidden_size));
  if (kv_channels == 0 && hidden_size % num_attention_heads != 0)
    throw std::invalid_argument(fmt::format(
        "model shape: hidden_size {} must be divisible by num_attention_heads {}", hidden_size,
        num_attention_heads));
  if (num_query_groups < 0 || (num_query_groups > 0 && num_attention_heads % num_query_groups != 0))
    throw std::invalid_argument(fmt::format(
        "model shape: num_query_groups {} must divide num_attention_heads {} (0 = one per head)",
        num_query_groups, num_attention_heads));
}

double ModelShape::parameter_count() const {
  const double h = double(hidden_size), f = double(ffn());
  const double per_layer = 4 * h * h + 2 * h * f + 3 * h + h + f + h + 4 * h;
  return double(num_layers) * per_layer + (double(padded_vocab_size()) + double(seq_length)) * h + 2 * h;
}

namespace {
/// Forward FLOPs of one transformer layer on one sample: s·(8h² + 4h·ffn) GEMM FLOPs (QKV 6h²,
/// projection 2h², MLP 4h·ffn per token) and 4s²h for the attention scores and their use.
double layer_forward_flops(const ModelShape& m) {
  const double s = double(m.seq_length), h = double(m.hidden_size), f = double(m.ffn());
  return s * (8 * h * h + 4 * h * f) + 4 * s * s * h;
}
/// Forward FLOPs of the logits GEMM on one sample: 2·s·h·V.
double logits_forward_flops(const ModelShape& m, int tensor_parallel) {
  return 2 * double(m.seq_length) * double(m.hidden_size) * double(m.padded_vocab_size(tensor_parallel));
}
}  // namespace

double ModelShape::model_flops_per_sample(int tensor_parallel) const {
  return 3 * (double(num_layers) * layer_forward_flops(*this) + logits_forward_flops(*this, tensor_parallel));
}

double ModelShape::full_recompute_flops_per_sample(int tensor_parallel) const {
  return 4 * double(num_layers) * layer_forward_flops(*this) + 3 * logits_forward_flops(*this, tensor_parallel);
}

std::string ModelShape::summary() const {
  return fmt::format("{}L h{} a{} ffn{} s{} V{} ({:.2f}B params)", num_layers, hidden_size,
                     num_attention_heads, ffn(), seq_length, vocab_size, parameter_count() / 1e9);
}

}  // namespace loom
