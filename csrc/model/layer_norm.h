// LayerNorm with replicated weight [h] = 1 and bias [h] = 0. Under sequence parallelism it
// runs on the local [s/t, b, h] shard and its parameters are marked sequence_parallel
// (gradients SUM all-reduced over the TP group, docs/design/sp_sar.md).
#pragma once
#include <ATen/core/Tensor.h>

#include <string>

#include "model/parameter.h"

namespace loom::model {

class LayerNorm {
 public:
  LayerNorm(std::string name, int64_t hidden, double eps, bool sequence_parallel,
            const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x) const;  ///< loom::ops::layer_norm over the last dim
  void collect(ParamList& out) const;

 private:
  std::string name_;
  double eps_;
  bool sequence_parallel_;
  at::Tensor weight_, bias_;
};

}  // namespace loom::model
