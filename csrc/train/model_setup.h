// From a recipe to this rank's model chunks and their trainable parameters.
#pragma once
#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "config/recipe.h"
#include "model/gpt_config.h"
#include "model/gpt_stage.h"
#include "rules/layout.h"
#include "runtime/process_groups.h"

namespace loom::train {

/// The model section of a validated recipe as the model's config (with a fine-tuning recipe's
/// LoRA adapters, model.peft); `vocab_size` is the tokenizer's (unpadded) vocabulary.
model::GptConfig gpt_config_from_recipe(const config::Recipe& recipe, int64_t vocab_size);

/// Model FLOPs of one optimizer step of `config`'s model at `layout`: layout.global_batch
/// samples of the one formula, ModelShape::model_flops_per_sample, with the vocabulary padded
/// for layout.tp. The step log's MFU divides it by the step time and the accelerator's peak;
/// the planner's model TFLOP/s counts the same FLOPs.
double model_flops_per_step(const model::GptConfig& config, const Layout& layout);

/// This rank's model chunks: one per virtual pipeline stage it holds (v chunks; chunk k is
/// virtual stage k·p + pipeline rank), built on `device`.
std::vector<model::GptStage> build_model_chunks(const model::GptConfig& config,
                                                runtime::ProcessGroups& groups, int virtual_stages,
                                                at::Device device);

/// Every parameter of the chunks, in chunk order, as the layers describe them (model/parameter.h:
/// sharding, sequence-parallel and tied-embedding flags, weight decay).
model::ParamList chunk_parameters(const std::vector<model::GptStage>& chunks);

}  // namespace loom::train
