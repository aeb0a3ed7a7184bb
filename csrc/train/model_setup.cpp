#include "train/model_setup.h"

#include <ATen/ATen.h>

#include "config/derived.h"

namespace loom::train {

model::GptConfig gpt_config_from_recipe(const config::Recipe& recipe, int64_t vocab_size) {
  const auto& m = recipe.model;
  model::GptConfig c(config::recipe_model_shape(recipe, vocab_size));
  // Initialisation and numerics.
  c.init_method_std = m.init_method_std;
  c.seed = static_cast<uint64_t>(m.seed);
  c.params_dtype = recipe.trainer.precision;
  c.layernorm_epsilon = m.layernorm_epsilon;
  // How the layers run: the one layout (sequence parallelism, recomputation, uneven stages), and
  // the attention core.
  c.layout = config::recipe_layout(recipe);
  c.use_flash_attention = m.use_flash_attention;
  c.persist_layer_norm = m.persist_layer_norm;
  c.bias_activation_fusion = m.bias_activation_fusion;
  c.apply_rope_fusion = m.apply_rope_fusion;
  // Regularisation.
  c.hidden_dropout = m.hidden_dropout;
  c.attention_dropout = m.attention_dropout;
  c.label_smoothing = m.label_smoothing;
  // Fine-tuning recipes with peft_scheme lora: adapters per model.peft (the recipe check validated the fields).
  if (recipe.kind == config::RecipeKind::kFinetuning && m.peft.peft_scheme == "lora") {
    const auto& l = m.peft.lora_tuning;
    c.lora.dim = l.adapter_dim;
    c.lora.alpha = l.alpha.value_or(static_cast<double>(l.adapter_dim));
    c.lora.dropout = l.adapter_dropout;
    c.lora.targets = parse_lora_targets(l.target_modules);
  }
  return c;
}

double model_flops_per_step(const model::GptConfig& config, const Layout& layout) {
  return double(layout.global_batch) * config.model_flops_per_sample(layout.tp);
}

std::vector<model::GptStage> build_model_chunks(const model::GptConfig& config,
                                                runtime::ProcessGroups& groups, int virtual_stages,
                                                at::Device device) {
  const auto layouts = model::pipeline_stage_layouts(
      config, groups.layout().pipeline_parallel(), virtual_stages, groups.coords().pp);
  std::vector<model::GptStage> chunks;
  chunks.reserve(layouts.size());
  for (const auto& layout : layouts) chunks.emplace_back(config, groups.tensor_ptr(), layout, device);
  return chunks;
}

model::ParamList chunk_parameters(const std::vector<model::GptStage>& chunks) {
  model::ParamList all;
  for (const auto& chunk : chunks)
    for (auto& p : chunk.parameters()) all.push_back(std::move(p));
  return all;
}

}  // namespace loom::train
