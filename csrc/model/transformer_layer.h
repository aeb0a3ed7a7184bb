// One pre-LayerNorm GPT decoder layer on [s, b, h] activations ([s/t, b, h] under sequence
// parallelism):
//   x = x + dropout(attention(LN1(x)) + b_proj)
//   x = x + dropout(mlp(LN2(x)) + b_fc2)
// with the residual adds and hidden dropout fused (loom::ops::bias_dropout_add).
#pragma once
#include <ATen/core/Tensor.h>

#include "model/attention.h"
#include "model/dropout_context.h"
#include "model/gpt_config.h"
#include "model/layer_norm.h"
#include "model/mlp.h"

namespace loom::model {

class KvCache;

class TransformerLayer {
 public:
  /// `layer` is the global layer number in [0, num_layers).
  TransformerLayer(const GptConfig& config, int layer, runtime::CommunicatorPtr tp,
                   const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x, const DropoutContext& dropout) const;
  /// Inference (cached_forward.cpp): forward() without dropout for x [n, b, h] of n new
  /// positions whose keys and values go to `cache`.
  at::Tensor forward_cached(const at::Tensor& x, KvCache& cache) const;
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
