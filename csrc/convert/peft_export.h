// `loom convert --to peft DIR --checkpoint ADAPTER_RUN [--base-model HF] [--iteration N] [--overwrite]`: the LoRA
// adapters of a `loom finetune` checkpoint in Hugging Face PEFT's format (docs/design/lora.md),
// for the base exported with `loom convert --to hf`:
//   adapter_config.json        peft_type LORA, r, lora_alpha, lora_dropout, target_modules (HF
//                              module names), fan_in_fan_out (GPT-2's Conv1D), task_type CAUSAL_LM
//   adapter_model.safetensors  base_model.model.<module>.lora_A.weight [r, in] and
//                              .lora_B.weight [out, r] per adapted module
// GPT2LMHeadModel: c_attn, attn.c_proj, c_fc, mlp.c_proj. LlamaForCausalLM: the fused QKV
// adapter becomes q_proj, k_proj, v_proj adapters sharing A (their B the rows of each
// projection), the fc1 adapter gate_proj and up_proj adapters sharing A: exactly the same
// update. B's rows are laid out by the converter's own weight mapping (hf_gpt2.h, hf_llama.h).
#pragma once
#include "convert/hf_export.h"

namespace loom::convert {

struct PeftExportResult {
  int64_t iteration = 0;
  int modules = 0;  ///< HF modules with an adapter
};

/// `base_model` becomes adapter_config.json's base_model_name_or_path, what PEFT's
/// AutoPeftModelForCausalLM loads the adapters onto (the base's `--to hf` export or its Hub
/// name); empty: the base's Loom checkpoints directory, as a record only. Throws
/// ConvertInputError naming the checkpoint or directory for bad input (not an adapter
/// checkpoint, its base changed or gone, an occupied output without `overwrite`).
PeftExportResult export_peft(const HfExportRequest& request, const std::string& base_model = "");

}  // namespace loom::convert
