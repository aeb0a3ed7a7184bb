// The GPT model's hyperparameters as one plain struct (NeMo Megatron field names, see
// conventions.md "Recipes"), plus the derived sizes every layout must agree on.
// Torch-free: the config helper maps a YAML recipe into it.
#pragma once
#include <cstdint>
#include <string>

namespace loom::model {

/// activations_checkpoint_granularity: null | selective | full.
enum class RecomputeGranularity { kNone, kSelective, kFull };
/// activations_checkpoint_method (full recompute only): uniform | block.
enum class RecomputeMethod { kUniform, kBlock };
/// Parameter/activation dtype (trainer.precision 32 | bf16 | 16).
enum class ParamsDtype { kFloat32, kBFloat16, kFloat16 };

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
  double layernorm_epsilon = 1e-5;
  bool sequence_parallel = false;
  RecomputeGranularity activations_checkpoint_granularity = RecomputeGranularity::kNone;
  RecomputeMethod activations_checkpoint_method = RecomputeMethod::kUniform;
  int activations_checkpoint_num_layers = 1;
  double label_smoothing = 0.0;
  uint64_t seed = 1234;              ///< initialisation seed (dropout seeds come per call)
  ParamsDtype params_dtype = ParamsDtype::kFloat32;

  int64_t ffn() const { return ffn_hidden_size > 0 ? ffn_hidden_size : 4 * hidden_size; }
  int64_t head_dim() const { return hidden_size / num_attention_heads; }

  /// Vocabulary padded to a multiple of lcm(make_vocab_size_divisible_by, t). With the default
  /// 128 this is the same size for every power-of-two t <= 128 (50257 -> 50304). Logits of the
  /// pad columns are excluded from the loss and pad embedding rows start at zero, so the model
  /// (loss, gradients of the real rows) does not depend on the padding at all.
  int64_t padded_vocab_size(int tensor_parallel) const;

  /// Throws std::invalid_argument naming the field when the config is inconsistent, or does
  /// not fit `tensor_parallel` ranks (heads % t, ffn % t, s % t under sequence parallelism,
  /// seq_length > max_position_embeddings, dropout outside [0, 1), ...).
  void validate(int tensor_parallel) const;
};

std::string to_string(RecomputeGranularity g);  ///< "null" | "selective" | "full"
std::string to_string(RecomputeMethod m);       ///< "uniform" | "block"

}  // namespace loom::model
