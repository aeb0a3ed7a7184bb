// Which Hugging Face modules one Loom linear is, for LoRA adapters in PEFT's format
// (docs/design/lora.md, "PEFT export and import"): the fused QKV of a Llama is three HF
// projections, its SwiGLU fc1 two; GPT-2's Conv1D modules map one to one.
#pragma once
#include <string>
#include <vector>

#include "rules/lora_config.h"

namespace loom::convert {

struct PeftModuleMap {
  std::string loom;                  ///< the linear below a Loom layer: "self_attention.linear_qkv"
  LoraTarget target;
  std::vector<std::string> modules;  ///< HF module names below the layer, in the converter's row order
};

/// GPT2LMHeadModel (`gpt2`) or LlamaForCausalLM modules of every LoRA target.
inline std::vector<PeftModuleMap> peft_module_maps(bool gpt2) {
  if (gpt2)
    return {{"self_attention.linear_qkv", kLoraAttentionQkv, {"attn.c_attn"}},
            {"self_attention.linear_proj", kLoraAttentionDense, {"attn.c_proj"}},
            {"mlp.linear_fc1", kLoraMlpFc1, {"mlp.c_fc"}},
            {"mlp.linear_fc2", kLoraMlpFc2, {"mlp.c_proj"}}};
  return {{"self_attention.linear_qkv", kLoraAttentionQkv, {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}},
          {"self_attention.linear_proj", kLoraAttentionDense, {"self_attn.o_proj"}},
          {"mlp.linear_fc1", kLoraMlpFc1, {"mlp.gate_proj", "mlp.up_proj"}},
          {"mlp.linear_fc2", kLoraMlpFc2, {"mlp.down_proj"}}};
}

/// The prefix of layer i's modules in the HF state dict and in PEFT's tensor names (after
/// "base_model.model.").
inline const char* peft_layer_root(bool gpt2) { return gpt2 ? "transformer.h." : "model.layers."; }

}  // namespace loom::convert
