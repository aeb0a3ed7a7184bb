// Which linears of a GPT carry LoRA adapters and their shape (Hu et al. 2021, "LoRA: Low-Rank
// Adaptation of Large Language Models", §4.1; NeMo 1.x model.peft.lora_tuning field names;
// docs/design/lora.md). Torch-free (the recipe check parses target names too): part of
// model::GptConfig, filled from a recipe's model.peft.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace loom {

/// The linears LoRA can adapt, as NeMo names them in lora_tuning.target_modules.
enum LoraTarget : unsigned {
  kLoraAttentionQkv = 1u << 0,    ///< attention_qkv: the fused QKV projection (column-parallel)
  kLoraAttentionDense = 1u << 1,  ///< attention_dense: the output projection (row-parallel)
  kLoraMlpFc1 = 1u << 2,          ///< mlp_fc1: fc1, or gate and up of SwiGLU (column-parallel)
  kLoraMlpFc2 = 1u << 3,          ///< mlp_fc2: fc2 (row-parallel)
  kLoraAllTargets = 0xFu,         ///< all
};

struct LoraConfig {
  int64_t dim = 0;       ///< r, the adapters' rank (adapter_dim); 0: no adapters
  double alpha = 32.0;   ///< the update is scaled by alpha / r
  double dropout = 0.0;  ///< dropout on each adapter's input (adapter_dropout), in [0, 1)
  unsigned targets = 0;  ///< LoraTarget bits

  bool enabled() const { return dim > 0 && targets != 0; }
  bool adapts(LoraTarget target) const { return enabled() && (targets & target) != 0; }
  double scale() const { return alpha / static_cast<double>(dim); }
};

/// NeMo's name of one target ("attention_qkv", ...).
const char* lora_target_name(LoraTarget target);
/// The bits of NeMo's target_modules names ("all" is every target). Throws
/// std::invalid_argument naming the unknown entry and the accepted names.
unsigned parse_lora_targets(const std::vector<std::string>& names);
/// The names of `targets`' bits, in the order of LoraTarget.
std::vector<std::string> lora_target_names(unsigned targets);

}  // namespace loom
