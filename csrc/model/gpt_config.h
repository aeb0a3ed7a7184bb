// The GPT model's hyperparameters as one plain struct (NeMo Megatron field names, see
// docs/design/conventions.md "Recipes"): the model's shape (loom::ModelShape) and how it runs.
// Torch-free: train::gpt_config_from_recipe maps a YAML recipe into it.
#pragma once
#include <cstdint>

#include "rules/lora_config.h"
#include "rules/layout.h"
#include "rules/layout_terms.h"
#include "rules/model_shape.h"

namespace loom::model {

// The recipe's vocabulary (rules/layout_terms.h): one spelling for recipe, model and planner.
using loom::Precision;
using loom::RecomputeGranularity;
using loom::RecomputeMethod;
using loom::LoraConfig;

/// The model's constructor options: its shape (the one loom::ModelShape, rules/model_shape.h,
/// held as the base so that config.hidden_size reads it) and how it runs.
struct GptConfig : ModelShape {
  /// A tiny model for tests: 2 layers, hidden 32, 4 heads, ffn 4h, vocabulary 100 padded to a
  /// multiple of 128, sequences and position table of 8.
  GptConfig() : ModelShape{2, 32, 4, 0, 8, 8, 100, 128} {}
  explicit GptConfig(const ModelShape& shape) : ModelShape(shape) {}

  double init_method_std = 0.02;
  double hidden_dropout = 0.1;       ///< embedding and hidden (after attention / MLP) dropout
  double attention_dropout = 0.1;    ///< attention-probability dropout
  /// model.use_flash_attention: the core through at::scaled_dot_product_attention (attention.h);
  /// needs attention_dropout 0 and no selective recompute (rules::fused_attention_violations).
  bool use_flash_attention = false;
  /// The op library's fused kernels (NeMo / Megatron-Core names; false: ATen compositions):
  /// persist_layer_norm: loom::layer_norm / loom::rms_norm (a bias-less LayerNorm stays ATen's);
  /// bias_activation_fusion: loom::bias_gelu / loom::swiglu; apply_rope_fusion: loom::rotary.
  bool persist_layer_norm = true;
  bool bias_activation_fusion = true;
  bool apply_rope_fusion = true;
  double layernorm_epsilon = 1e-5;
  double label_smoothing = 0.0;
  uint64_t seed = 1234;              ///< initialisation seed (dropout seeds come per call)
  Precision params_dtype = Precision::kFp32;  ///< parameter and activation dtype (trainer.precision)
  /// The run's layout (the one loom::Layout, rules/layout.h). The model reads how its layers
  /// run from it: sequence_parallel (GptStage turns it off at t = 1), recompute (full: the
  /// method and layer count through RecomputeSettings::method_or_uniform / num_layers_or_one)
  /// and the uneven first / last stage (pipeline_split). t, p and v come from the tensor group
  /// and pipeline_stage_layouts' arguments, not from here.
  Layout layout;
  /// LoRA adapters on the attention and MLP linears (model.peft; lora.h). Default: none.
  LoraConfig lora;

  /// Throws std::invalid_argument naming the field when the config is inconsistent (sizes < 1,
  /// dropout outside [0, 1), ...) or breaks a layout rule for `tensor_parallel` ranks
  /// (rules::tensor_parallel_violations, rules::recompute_violations: the recipe check's rules
  /// and messages).
  void validate(int tensor_parallel) const;
};

}  // namespace loom::model
