// The normalisation layer of a GPT or Llama decoder: LayerNorm with replicated weight [h] = 1
// and bias [h] = 0 (no bias with model.bias false), or RMSNorm (rms_norm.h) with weight [h] = 1
// only (model.normalization rmsnorm). Under sequence parallelism it runs on the local
// [s/t, b, h] shard and its parameters are marked sequence_parallel (gradients SUM all-reduced
// over the TP group, docs/design/sp_sar.md). The parameter names are Megatron-Core's for both
// kinds ("<name>.weight", "<name>.bias").
#pragma once
#include <ATen/core/Tensor.h>

#include <string>

#include "model/parameter.h"
#include "rules/model_shape.h"

namespace loom::model {

class LayerNorm {
 public:
  LayerNorm(std::string name, int64_t hidden, double eps, bool sequence_parallel,
            const at::TensorOptions& options, Normalization kind = Normalization::kLayerNorm,
            bool bias = true, bool fused = true);
  /// Over the last dim. fused (model.persist_layer_norm): loom::ops::layer_norm or
  /// loom::ops::rms_norm; otherwise, and for a LayerNorm without bias, at::layer_norm or the
  /// rms_norm composition (rms_norm.h).
  at::Tensor forward(const at::Tensor& x) const;
  void collect(ParamList& out) const;

 private:
  std::string name_;
  double eps_;
  bool sequence_parallel_;
  Normalization kind_;
  bool fused_;
  at::Tensor weight_, bias_;  ///< bias_ undefined for RMSNorm and without bias
};

}  // namespace loom::model
