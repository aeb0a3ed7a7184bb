// The GPT model's hyperparameters as one plain struct (NeMo Megatron field names, see
// docs/design/conventions.md "Recipes"), plus the derived sizes every layout must agree on.
// Torch-free: the config helper maps a YAML recipe into it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "rules/layout_terms.h"

namespace loom::model {

// The recipe's vocabulary (rules/layout_terms.h): one spelling for recipe, model and planner.
using loom::Precision;
using loom::RecomputeGranularity;
using loom::RecomputeMethod;

struct GptConfig {
  int num_layers = 2;
  int64_t hidden_size = 32;
  int64_t ffn_hidden_size = 0;       ///< 0: 4 * hidden_size
  int64_t num_attention_heads = 4;
  int64_t vocab_size = 100;          ///< real (unpadded) vocabulary
  int64_t make_vocab_size_divisible_by = 128;
  int64_t max_position_embeddings = 8;
  int64_t seq_length = 8;
  double init_method_std = 0.02;
  double hidden_dropout = 0.1;       ///< embedding and hidden (after attention / MLP) dropout
  double attention_dropout = 0.1;    ///< attention-probability dropout
  /// model.use_flash_attention: the core through at::scaled_dot_product_attention (attention.h);
  /// needs attention_dropout 0 and no selective recompute (rules::fused_attention_violations).
  bool use_flash_attention = false;
  double layernorm_epsilon = 1e-5;
  bool sequence_parallel = false;
  RecomputeGranularity activations_checkpoint_granularity = RecomputeGranularity::kNone;
  RecomputeMethod activations_checkpoint_method = RecomputeMethod::kUniform;  ///< full only
  int activations_checkpoint_num_layers = 1;  ///< uniform: layers per group; block: layers recomputed
  double label_smoothing = 0.0;
  uint64_t seed = 1234;              ///< initialisation seed (dropout seeds come per call)
  Precision params_dtype = Precision::kFp32;  ///< parameter and activation dtype (trainer.precision)
  /// Megatron-Core's uneven pipeline split (model.num_layers_in_first/last_pipeline_stage):
  /// transformer layers of the first / last pipeline stage; null: an even share. Read by
  /// pipeline_stage_layouts through rules::stage_layer_counts.
  std::optional<int> num_layers_in_first_pipeline_stage;
  std::optional<int> num_layers_in_last_pipeline_stage;

  int64_t ffn() const { return ffn_hidden_size > 0 ? ffn_hidden_size : 4 * hidden_size; }
  int64_t head_dim() const { return hidden_size / num_attention_heads; }

  /// Vocabulary padded to a multiple of lcm(make_vocab_size_divisible_by, t). With the default
  /// 128 this is the same size for every power-of-two t <= 128 (50257 -> 50304). Logits of the
  /// pad columns are excluded from the loss and pad embedding rows start at zero, so the model
  /// (loss, gradients of the real rows) does not depend on the padding at all.
  int64_t padded_vocab_size(int tensor_parallel) const;

  /// Throws std::invalid_argument naming the field when the config is inconsistent (sizes < 1,
  /// dropout outside [0, 1), ...) or breaks a layout rule for `tensor_parallel` ranks
  /// (rules::tensor_parallel_violations, rules::recompute_violations: the recipe check's rules
  /// and messages).
  void validate(int tensor_parallel) const;
};

}  // namespace loom::model
