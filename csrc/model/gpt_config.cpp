#include "model/gpt_config.h"

#include <numeric>
#include <stdexcept>

#include "rules/layout_rules.h"

namespace loom::model {

namespace {
[[noreturn]] void fail(const std::string& field, const std::string& what) {
  throw std::invalid_argument("GptConfig: model." + field + ": " + what);
}
}  // namespace

void GptConfig::validate(int t) const {
  if (t < 1) fail("tensor_model_parallel_size", "expected >= 1, found " + std::to_string(t));
  auto positive = [](const std::string& f, int64_t v) {
    if (v < 1) fail(f, "expected a positive integer, found " + std::to_string(v));
  };
  positive("num_layers", num_layers);
  positive("hidden_size", hidden_size);
  positive("num_attention_heads", num_attention_heads);
  positive("vocab_size", vocab_size);
  positive("max_position_embeddings", max_position_embeddings);
  positive("encoder_seq_length", seq_length);
  positive("make_vocab_size_divisible_by", make_vocab_size_divisible_by);
  if (ffn_hidden_size < 0) fail("ffn_hidden_size", "expected >= 0 (0 = 4 * hidden_size)");
  rules::throw_if_any(rules::tensor_parallel_violations(*this, t, layout.sequence_parallel), "GptConfig:");
  auto probability = [](const std::string& f, double p) {
    if (!(p >= 0.0 && p < 1.0)) fail(f, "expected a probability in [0, 1), found " + std::to_string(p));
  };
  probability("hidden_dropout", hidden_dropout);
  probability("attention_dropout", attention_dropout);
  probability("label_smoothing", label_smoothing);
  if (!(init_method_std > 0.0)) fail("init_method_std", "expected > 0");
  if (!(layernorm_epsilon > 0.0)) fail("layernorm_epsilon", "expected > 0");
  // The stage's chunk is not known here; a group longer than the stage is one group.
  const RecomputeSettings& r = layout.recompute;
  if (r.full())
    rules::throw_if_any(rules::recompute_violations({r.granularity, r.method_or_uniform(), r.num_layers_or_one()},
                                                    num_layers),
                        "GptConfig:");
  rules::throw_if_any(rules::fused_attention_violations(use_flash_attention, attention_dropout, r.granularity),
                      "GptConfig:");
  if (lora.dim < 0) fail("peft.lora_tuning.adapter_dim", "expected >= 1, found " + std::to_string(lora.dim));
  if (lora.enabled()) {
    if (!(lora.alpha > 0.0)) fail("peft.lora_tuning.alpha", "expected > 0, found " + std::to_string(lora.alpha));
    probability("peft.lora_tuning.adapter_dropout", lora.dropout);
  }
  if (label_smoothing > 0.0 && vocab_size < 2)
    fail("label_smoothing", "needs a vocabulary of at least 2 tokens");
}

}  // namespace loom::model
