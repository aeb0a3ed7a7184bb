// The correspondence between Loom's GPT and Hugging Face's GPT2LMHeadModel
// (docs/design/checkpoint_conversion.md has the table): parameter names, layouts and the
// config.json fields. Both models are pre-LayerNorm GPT-2 with learned position embeddings,
// the tanh GeLU (HF "gelu_new"), attention scaled by 1/sqrt(head_dim) and the output layer tied
// to the word embedding; they differ in
//   - names: "layers.3.self_attention.linear_qkv.weight" vs "transformer.h.3.attn.c_attn.weight";
//   - dense weights: Loom's are Linear [out, in], HF's Conv1D [in, out] (transposed);
//   - the fused QKV: Loom's output rows are grouped per head [q_h | k_h | v_h] (Megatron's
//     layout, so that a tensor-parallel slice holds whole heads), HF's are [q | k | v] with
//     heads inside each;
//   - the word embedding: Loom's has the vocabulary padded (GptConfig::padded_vocab_size) with
//     zero rows, HF's exactly the tokenizer's size.
#pragma once
#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>

#include "rules/model_shape.h"

namespace loom::convert {

/// The model fields both sides must agree on: the one model shape (vocab_size the real
/// vocabulary, the tokenizer's size; ffn_hidden_size set) and the LayerNorm epsilon.
struct Gpt2Shape : ModelShape {
  double layernorm_epsilon = 1e-5;
};

/// config.json values that do not change the forward pass.
struct HfConfigExtras {
  double hidden_dropout = 0.1;     ///< resid_pdrop and embd_pdrop
  double attention_dropout = 0.1;  ///< attn_pdrop
  double init_method_std = 0.02;   ///< initializer_range
  int64_t eod_id = 50256;          ///< bos_token_id, eos_token_id
  std::string dtype = "float32";   ///< "dtype" (transformers 5; older versions "torch_dtype")
};

/// Loom's global parameters (model/parameter.h names, the word embedding with or without pad
/// rows) → the GPT2LMHeadModel state dict without the tied "lm_head.weight" (as
/// save_pretrained writes it), contiguous, in the same dtype. Throws ConvertInputError naming
/// the parameter when one is missing or of another shape than `shape` gives.
std::map<std::string, at::Tensor> loom_to_hf(const std::map<std::string, at::Tensor>& loom, const Gpt2Shape& shape);

/// The inverse: an HF state dict (keys with or without the "transformer." prefix; the causal
/// mask buffers "attn.bias"/"attn.masked_bias" of older files ignored; "lm_head.weight", when
/// present, must equal the word embedding) → Loom's global parameters, the word embedding
/// padded with zero rows to `padded_vocab`. Throws ConvertInputError naming `file` and the
/// tensor for a missing tensor, a wrong shape, an unknown tensor or an untied lm_head.
std::map<std::string, at::Tensor> hf_to_loom(const std::map<std::string, at::Tensor>& hf, const Gpt2Shape& shape,
                                             int64_t padded_vocab, const std::string& file);

/// config.json of a GPT2LMHeadModel of `shape`.
nlohmann::json hf_config_json(const Gpt2Shape& shape, const HfConfigExtras& extras);

/// The shape of a GPT2LMHeadModel's config.json. Throws ConvertInputError naming `file` and the
/// field when a field is missing or has a value Loom's GPT cannot represent (model_type other
/// than gpt2, activation_function other than the tanh GeLU, untied embeddings, unscaled or
/// layer-scaled attention, cross-attention, n_embd not divisible by n_head).
Gpt2Shape gpt2_shape_from_config(const nlohmann::json& config, const std::string& file);

/// Checks the sizes of `shape` (read from `config_file`) against the tensors of an HF state dict
/// (read from `weights_file`) before anything of those sizes is built, so that an absurd
/// config.json is refused up front instead of allocating: vocab_size and n_embd against
/// wte.weight, n_positions against wpe.weight, n_layer against the h.N layers present, n_inner
/// against h.0.mlp.c_fc.weight. Throws ConvertInputError naming `config_file`, the field, its
/// value and the tensor's size, or `weights_file` and the tensor when one of these is missing.
void check_config_against_tensors(const Gpt2Shape& shape, const std::map<std::string, at::Tensor>& hf,
                                  const std::string& config_file, const std::string& weights_file);

}  // namespace loom::convert
