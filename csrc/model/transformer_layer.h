// One pre-norm GPT or Llama decoder layer on [s, b, h] activations ([s/t, b, h] under sequence
// parallelism):
//   x = x + dropout(attention(N1(x)) + b_proj)
//   x = x + dropout(mlp(N2(x)) + b_fc2)
// N LayerNorm or RMSNorm, the biases absent with model.bias false, with the residual adds and
// hidden dropout fused (loom::ops::bias_dropout_add).
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>

#include "model/attention.h"
#include "model/dropout_context.h"
#include "model/gpt_config.h"
#include "model/layer_norm.h"
#include "model/mlp.h"

namespace loom::model {

class KvCache;

/// A linear layer's returned bias as bias_dropout_add takes it: nullopt when the model has none.
std::optional<at::Tensor> optional_bias(const at::Tensor& bias);

class TransformerLayer {
 public:
  /// `layer` is the global layer number in [0, num_layers).
  TransformerLayer(const GptConfig& config, int layer, runtime::CommunicatorPtr tp,
                   const at::TensorOptions& options);
  /// `rotary`: the RoPE tables of the whole sequence (rotary.h; inactive for learned positions);
  /// `document`: packed rows' mask (document_mask.h; inactive: each row one sequence).
  at::Tensor forward(const at::Tensor& x, const DropoutContext& dropout, const RotaryTables& rotary = {},
                     const DocumentMask& document = {}) const;
  /// Inference (cached_forward.cpp): forward() without dropout for x [n, b, h] of n new
  /// positions whose keys and values go to `cache`; `rotary` the tables of their positions.
  at::Tensor forward_cached(const at::Tensor& x, KvCache& cache, const RotaryTables& rotary = {},
                            const LoraBatch* served = nullptr) const;
  int layer() const { return layer_; }
  void collect(ParamList& out) const;

 private:
  GptConfig config_;
  int layer_;
  runtime::CommunicatorPtr tp_;
  LayerNorm ln1_;
  ParallelAttention attention_;
  LayerNorm ln2_;
  ParallelMlp mlp_;
};

}  // namespace loom::model
