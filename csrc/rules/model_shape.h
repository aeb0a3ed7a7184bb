// The one description of a GPT model's shape, in the recipe's terms (model.num_layers,
// model.hidden_size, ...): what the layout rules check, the planner plans, the model is built
// from (model::GptConfig holds it) and the FLOPs count reads. Torch-free.
// docs/design/sp_sar.md ("FLOPs") and docs/design/planner_sources.md have the formulas.
#pragma once
#include <cstdint>
#include <string>

namespace loom {

/// model.normalization: layernorm (GPT) | rmsnorm (Llama: x / sqrt(mean(x²) + eps) · w, no bias).
enum class Normalization { kLayerNorm, kRmsNorm };
/// model.position_embedding_type: learned_absolute (a trained position table, GPT) | rope
/// (rotary embeddings on Q and K, rotate-half pairing as Megatron-Core and transformers use).
enum class PositionEmbedding { kLearnedAbsolute, kRope };
/// model.activation: gelu (tanh approximation, GPT) | fast-swiglu (gated MLP:
/// down(silu(gate(x)) · up(x)), ffn_hidden_size the width of gate and of up).
enum class Activation { kGelu, kSwiglu };

/// Llama 3.1's rescaling of RoPE's inverse frequencies (docs/design/llama.md, "RoPE and
/// positions"): model.rope_scaling and rope_scaling_factor (Megatron-Core's names),
/// low_freq_factor, high_freq_factor and old_context_len (NeMo 2's Llama31Config); HF's
/// rope_scaling {rope_type: llama3, factor, low_freq_factor, high_freq_factor,
/// original_max_position_embeddings}.
struct RopeScaling {
  bool enabled = false;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t old_context_len = 8192;  ///< positions (the pre-training context)
  bool is_default() const;         ///< every member at its default (off)
};

/// The recipe spellings: "layernorm" / "rmsnorm", "learned_absolute" / "rope", "gelu" /
/// "fast-swiglu" (NeMo's megatron_gpt_config names).
const char* recipe_name(Normalization n);
const char* recipe_name(PositionEmbedding p);
const char* recipe_name(Activation a);

/// Shape of a GPT-3-style decoder (pre-LayerNorm, learned positions, GeLU MLP, tied input and
/// output embedding). All sizes are element counts. The member order is fixed: the first six
/// are brace-initialised as {L, h, a, ffn, s, max_position_embeddings}.
struct ModelShape {
  int64_t num_layers = 0;               ///< model.num_layers, L
  int64_t hidden_size = 0;              ///< model.hidden_size, h
  int64_t num_attention_heads = 0;      ///< model.num_attention_heads, a (h % a == 0)
  int64_t ffn_hidden_size = 0;          ///< model.ffn_hidden_size; 0: 4h (ffn())
  int64_t seq_length = 2048;            ///< model.encoder_seq_length, s (tokens per sample)
  int64_t max_position_embeddings = 2048;  ///< model.max_position_embeddings
  /// V: the tokenizer's vocabulary (not in the recipe: model.tokenizer gives it). The logits
  /// and the embedding have padded_vocab_size() rows.
  int64_t vocab_size = 51200;
  /// model.make_vocab_size_divisible_by (recipes default to 128). 1 here, so that a shape made
  /// without a recipe (the planner's --vocab-size, --size) takes vocab_size as already padded.
  int64_t make_vocab_size_divisible_by = 1;

  // The decoder's architecture (Llama-family options; the defaults are GPT-3's, so a shape
  // made without them is the GPT model it always was). docs/design/llama.md.
  Normalization normalization = Normalization::kLayerNorm;           ///< model.normalization
  PositionEmbedding position_embedding_type = PositionEmbedding::kLearnedAbsolute;  ///< model.position_embedding_type
  double rotary_base = 10000.0;     ///< model.rotary_base: RoPE's θ (Llama 2: 1e4, Llama 3: 5e5)
  /// model.rotary_percentage: the leading int(head_dim · p) dimensions of each head are rotated,
  /// the rest pass through (Megatron-Core's rotary_percent; HF partial_rotary_factor).
  double rotary_percentage = 1.0;
  RopeScaling rope_scaling;         ///< Llama 3.1's frequency scaling (off by default)
  Activation activation = Activation::kGelu;  ///< model.activation
  /// model.num_query_groups: K/V heads, each shared by num_attention_heads / groups query heads
  /// (grouped-query attention; 1 = multi-query). 0 (the recipe's null): one per head.
  int64_t num_query_groups = 0;
  bool bias = true;  ///< model.bias: biases on every linear layer and norm (false: none)
  /// model.qkv_bias (NeMo; Megatron-Core's add_qkv_bias): a bias on the QKV projection even when
  /// bias is false (Qwen2: biases on Q, K and V only).
  bool qkv_bias = false;
  /// model.kv_channels (Megatron-Core; HF head_dim): the width of each attention head; 0 (the
  /// recipe's null): hidden_size / num_attention_heads.
  int64_t kv_channels = 0;
  /// model.share_embeddings_and_output_weights: the output layer is the word embedding (true)
  /// or its own column-parallel weight "output_layer.weight" [V_padded, h] (false).
  bool share_embeddings_and_output_weights = true;

  int64_t ffn() const { return ffn_hidden_size > 0 ? ffn_hidden_size : 4 * hidden_size; }
  int64_t head_dim() const { return kv_channels > 0 ? kv_channels : hidden_size / num_attention_heads; }
  /// The rotated dimensions of each head: int(head_dim() · rotary_percentage), as Megatron-Core
  /// and transformers truncate it.
  int64_t rotary_dim() const { return static_cast<int64_t>(static_cast<double>(head_dim()) * rotary_percentage); }
  /// K/V heads: num_query_groups, or num_attention_heads when it is 0.
  int64_t query_groups() const { return num_query_groups > 0 ? num_query_groups : num_attention_heads; }
  /// True when every architecture field has its GPT default (the shape checkpoints have always
  /// recorded: model_shape_to_json then writes no architecture keys).
  bool is_gpt() const;

  /// Vocabulary padded to a multiple of lcm(make_vocab_size_divisible_by, t) (a divisor < 1
  /// counts as 1). With the default 128 this is the same size for every power-of-two t <= 128
  /// (50257 -> 50304). The pad columns' logits are excluded from the loss and pad embedding rows
  /// start at zero, so the model's function does not depend on the padding.
  int64_t padded_vocab_size(int tensor_parallel = 1) const;

  /// Throws std::invalid_argument naming the field ("model shape: num_layers must be a positive
  /// integer, found 0") when a size is non-positive, ffn_hidden_size < 0 or h % a != 0 (without
  /// kv_channels).
  void validate() const;

  /// Exact parameter count with V = padded_vocab_size(1): L layers (layer_parameters,
  /// rules/model_shape_counts.h), the word embedding V·h, the position table
  /// max_position_embeddings·h (learned positions; none for RoPE), the final norm (h, 2h for a
  /// LayerNorm with bias) and the output layer V·h when it is untied (a tied one is the
  /// embedding, not counted twice). GPT with ffn = 4h: 12Lh²(1 + 13/(12h)) + (V+s)h + 2h.
  double parameter_count() const;

  /// The one count of model FLOPs of a training sample (forward and backward, no
  /// recomputation): 3·(L·(2s·W + 4s²·a·d) + 2shV) with W the layer's four linear weights
  /// (layer_parameters(*this).weights: 4h² + 2h·ffn for GPT, h·(a+2g)d + a·d·h + 3h·ffn for a
  /// grouped-query SwiGLU layer) and V = padded_vocab_size(t) as the logits GEMM computes it
  /// (an untied output layer runs the same GEMM). For GPT with ffn = 4h this is
  /// 72·L·s·h²·(1 + s/(6h) + V/(12hL)) (Korthikanti et al. 2022, §6). The step log's MFU
  /// (train/step_log.h), the planner's model TFLOP/s and `loom eval`'s cost all use it.
  double model_flops_per_sample(int tensor_parallel = 1) const;

  /// FLOPs of a sample with full recomputation of every layer (one more forward of the layers,
  /// not of the logits): 96·L·s·h²·(1 + s/(6h) + V/(16hL)) for GPT with ffn = 4h (Narayanan et al.
  /// 2021, the figure their TFLOP/s per GPU counts).
  double full_recompute_flops_per_sample(int tensor_parallel = 1) const;

  /// "96L h12288 a96 ffn49152 s2048 V51200 (174.56B params)"; a Llama-family shape adds its
  /// groups and options: "32L h4096 a32 g8 ffn14336 s8192 V128256 rmsnorm rope fast-swiglu no-bias
  /// untied (8.03B params)".
  std::string summary() const;
};

}  // namespace loom
