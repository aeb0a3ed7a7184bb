#include "train/model_setup.h"

#include <ATen/ATen.h>

namespace loom::train {

model::GptConfig gpt_config_from_recipe(const config::Recipe& recipe, int64_t vocab_size) {
  const auto& m = recipe.model;
  model::GptConfig c;
  c.num_layers = static_cast<int>(m.num_layers);
  c.hidden_size = m.hidden_size;
  c.ffn_hidden_size = m.ffn_hidden_size;
  c.num_attention_heads = m.num_attention_heads;
  c.vocab_size = vocab_size;
  c.make_vocab_size_divisible_by = m.make_vocab_size_divisible_by;
  c.max_position_embeddings = m.max_position_embeddings;
  c.seq_length = m.data.seq_length;
  c.init_method_std = m.init_method_std;
  c.hidden_dropout = m.hidden_dropout;
  c.attention_dropout = m.attention_dropout;
  c.use_flash_attention = m.use_flash_attention;
  c.layernorm_epsilon = m.layernorm_epsilon;
  c.sequence_parallel = m.sequence_parallel;
  c.activations_checkpoint_granularity = m.activations_checkpoint_granularity;
  if (m.activations_checkpoint_method != RecomputeMethod::kNone)
    c.activations_checkpoint_method = m.activations_checkpoint_method;
  c.activations_checkpoint_num_layers =
      static_cast<int>(m.activations_checkpoint_num_layers.value_or(1));
  c.label_smoothing = m.label_smoothing;
  c.seed = static_cast<uint64_t>(m.seed);
  c.params_dtype = recipe.trainer.precision;
  if (m.num_layers_in_first_pipeline_stage)
    c.num_layers_in_first_pipeline_stage = static_cast<int>(*m.num_layers_in_first_pipeline_stage);
  if (m.num_layers_in_last_pipeline_stage)
    c.num_layers_in_last_pipeline_stage = static_cast<int>(*m.num_layers_in_last_pipeline_stage);
  return c;
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
