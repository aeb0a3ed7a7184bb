#include "rules/model_shape.h"

#include "rules/model_shape_counts.h"

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
         // Redundant spellings of GPT: a QKV bias beside bias: true, kv_channels written as h/a.
         (!qkv_bias || bias) && (kv_channels == 0 || kv_channels * num_attention_heads == hidden_size) &&
         rope_scaling.is_default() &&
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

int64_t qkv_width(const ModelShape& m) { return (m.num_attention_heads + 2 * m.query_groups()) * m.head_dim(); }

int64_t fc1_width(const ModelShape& m) { return m.activation == Activation::kSwiglu ? 2 * m.ffn() : m.ffn(); }

double norm_parameters(const ModelShape& m) {
  const double h = double(m.hidden_size);
  return m.normalization == Normalization::kLayerNorm && m.bias ? 2 * h : h;
}

LayerParameters layer_parameters(const ModelShape& m) {
  const double h = double(m.hidden_size), f = double(m.ffn());
  const double attention = double(m.num_attention_heads * m.head_dim());
  const double qkv = double(qkv_width(m)), fc1 = double(fc1_width(m));
  LayerParameters p;
  p.weights = h * qkv + attention * h + h * fc1 + f * h;
  p.split_biases = (m.bias || m.qkv_bias ? qkv : 0.0) + (m.bias ? fc1 : 0.0);  // qkv_bias: Qwen2's Q/K/V-only bias
  p.replicated = (m.bias ? 2 * h : 0.0) + 2 * norm_parameters(m);  // projection and fc2 biases; two norms
  return p;
}

double ModelShape::parameter_count() const {
  const double h = double(hidden_size), V = double(padded_vocab_size());
  const double positions = position_embedding_type == PositionEmbedding::kLearnedAbsolute
                               ? double(max_position_embeddings) * h : 0.0;
  const double output = share_embeddings_and_output_weights ? 0.0 : V * h;
  return double(num_layers) * layer_parameters(*this).per_rank(1) + V * h + positions + norm_parameters(*this) + output;
}

namespace {
/// Forward FLOPs of one transformer layer on one sample: 2s·W for the linear layers (W their
/// weights) and 4s²·a·d for the attention scores and their use (grouped-query attention shares
/// K and V between heads but computes every head's scores).
double layer_forward_flops(const ModelShape& m) {
  const double s = double(m.seq_length), attention = double(m.num_attention_heads * m.head_dim());
  return 2 * s * layer_parameters(m).weights + 4 * s * s * attention;
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
  const std::string groups = query_groups() != num_attention_heads ? fmt::format(" g{}", query_groups()) : "";
  std::string architecture;
  if (normalization != Normalization::kLayerNorm) architecture += std::string(" ") + recipe_name(normalization);
  if (position_embedding_type != PositionEmbedding::kLearnedAbsolute)
    architecture += std::string(" ") + recipe_name(position_embedding_type);
  if (activation != Activation::kGelu) architecture += std::string(" ") + recipe_name(activation);
  if (!bias) architecture += " no-bias";
  if (!share_embeddings_and_output_weights) architecture += " untied";
  if (qkv_bias && !bias) architecture += " qkv-bias";
  if (head_dim() * num_attention_heads != hidden_size) architecture += fmt::format(" d{}", head_dim());
  if (rotary_percentage != 1.0) architecture += fmt::format(" rotary{}", rotary_percentage);
  if (rope_scaling.enabled) architecture += fmt::format(" rope-scaled{}", rope_scaling.factor);
  return fmt::format("{}L h{} a{}{} ffn{} s{} V{}{} ({:.2f}B params)", num_layers, hidden_size, num_attention_heads,
                     groups, ffn(), seq_length, vocab_size, architecture, parameter_count() / 1e9);
}

}  // namespace loom
