// The correspondence between Loom's Llama-family decoder (model.normalization rmsnorm,
// position_embedding_type rope, activation fast-swiglu, num_query_groups, bias false) and
// Hugging Face's LlamaForCausalLM, or Qwen2ForCausalLM with model.qkv_bias (the same names plus
// self_attn.{q,k,v}_proj.bias; docs/design/llama.md has the names). Both are Linear
// [out, in]; they differ in
//   - names: "layers.3.self_attention.linear_qkv.weight" vs "model.layers.3.self_attn.q_proj"
//     (+ k_proj, v_proj);
//   - the fused QKV: Loom's rows per query group [q heads of the group | k | v] (attention.h),
//     HF's three separate projections, heads in order (query head i uses K/V head i / (a/g));
//     Qwen2's Q/K/V biases regroup the same way;
//   - the fused gate/up: Loom's linear_fc1 rows interleave gate and up one row at a time
//     (mlp.h), HF has gate_proj and up_proj;
//   - the vocabulary rows: Loom's word embedding and output layer are padded with zero rows.
// RoPE: both rotate dimension i with i + d/2 ("rotate-half"), so no Q/K row permutation is
// needed for HF checkpoints (Meta's original checkpoints would need one).
#pragma once
#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <map>
#include <string>

#include "convert/hf_gpt2.h"

namespace loom::convert {

/// True when config.json describes a LlamaForCausalLM, MistralForCausalLM or Qwen2ForCausalLM
/// (model_type "llama", "mistral" or "qwen2"; Mistral's tensors have Llama's names).
bool is_llama_config(const nlohmann::json& config);

/// Loom's global parameters → the LlamaForCausalLM state dict (with "lm_head.weight" only when
/// the output layer is untied), contiguous, in the same dtype. Throws ConvertInputError naming
/// the parameter when one is missing or of another shape than `shape` gives.
std::map<std::string, at::Tensor> loom_to_llama(const std::map<std::string, at::Tensor>& loom, const Gpt2Shape& shape);

/// The inverse: an HF state dict (RoPE's "rotary_emb.inv_freq" buffers of older files ignored;
/// with tied embeddings "lm_head.weight", when present, must equal the word embedding) → Loom's
/// global parameters, vocabulary rows padded with zeros to `padded_vocab`. Throws
/// ConvertInputError naming `file` and the tensor for a missing, misshapen, non-floating or
/// unknown tensor.
std::map<std::string, at::Tensor> llama_to_loom(const std::map<std::string, at::Tensor>& hf, const Gpt2Shape& shape,
                                                int64_t padded_vocab, const std::string& file);

/// config.json of a LlamaForCausalLM of `shape`, or of a Qwen2ForCausalLM when shape.qkv_bias
/// (sliding window off): head_dim, transformers 5's rope_parameters, and rope_theta (and
/// rope_scaling with Llama 3.1's scaling) for older readers.
nlohmann::json llama_config_json(const Gpt2Shape& shape, const HfConfigExtras& extras, int64_t bos_id, int64_t eos_id);

/// The shape of a LlamaForCausalLM's, MistralForCausalLM's or Qwen2ForCausalLM's config.json: layernorm_epsilon =
/// rms_norm_eps, kv_channels = head_dim when it is not hidden_size / num_attention_heads,
/// rope_scaling from rope_type llama3 (factor, low_freq_factor, high_freq_factor,
/// original_max_position_embeddings = old_context_len; "rope_scaling" read over
/// "rope_parameters", as transformers 5 does), Qwen2: qkv_bias true. Throws ConvertInputError
/// naming `file` and the field for a missing field or one Loom cannot represent: hidden_act
/// other than silu, a rope_type other than default and llama3, attention_bias or mlp_bias true,
/// pretraining_tp other than 1, num_key_value_heads not dividing num_attention_heads, Qwen2's
/// use_sliding_window true or a layer_types entry other than full_attention, Mistral's
/// sliding_window shorter than max_position_embeddings (a Mistral is exported as the
/// LlamaForCausalLM it then equals).
Gpt2Shape llama_shape_from_config(const nlohmann::json& config, const std::string& file);

/// Checks config.json's sizes against the tensors before anything of those sizes is built:
/// vocab_size and hidden_size against model.embed_tokens.weight, intermediate_size against
/// model.layers.0.mlp.gate_proj.weight, num_hidden_layers against the layers present. Throws
/// ConvertInputError naming the file, field and tensor.
void check_llama_config_against_tensors(const Gpt2Shape& shape, const std::map<std::string, at::Tensor>& hf,
                                        const std::string& config_file, const std::string& weights_file);

}  // namespace loom::convert
