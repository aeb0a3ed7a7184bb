#include "rules/lora_config.h"

#include <stdexcept>

namespace loom {

namespace {
constexpr LoraTarget kTargets[] = {kLoraAttentionQkv, kLoraAttentionDense, kLoraMlpFc1, kLoraMlpFc2};
}

const char* lora_target_name(LoraTarget target) {
  switch (target) {
    case kLoraAttentionQkv: return "attention_qkv";
    case kLoraAttentionDense: return "attention_dense";
    case kLoraMlpFc1: return "mlp_fc1";
    case kLoraMlpFc2: return "mlp_fc2";
    default: return "all";
  }
}

unsigned parse_lora_targets(const std::vector<std::string>& names) {
  unsigned bits = 0;
  for (const auto& name : names) {
    if (name == "all") {
      bits |= kLoraAllTargets;
      continue;
    }
    unsigned found = 0;
    for (LoraTarget t : kTargets)
      if (name == lora_target_name(t)) found = t;
    if (!found)
      throw std::invalid_argument("expected attention_qkv, attention_dense, mlp_fc1, mlp_fc2 or all, found '" + name +
                                  "'");
    bits |= found;
  }
  return bits;
}

std::vector<std::string> lora_target_names(unsigned targets) {
  std::vector<std::string> out;
  for (LoraTarget t : kTargets)
    if (targets & t) out.push_back(lora_target_name(t));
  return out;
}

}  // namespace loom
