// The 4h MLP of a GPT layer: column-parallel fc1 [h -> ffn/t], GeLU (tanh approximation) fused
// with fc1's bias (loom::ops::bias_gelu), row-parallel fc2 [ffn/t -> h].
#pragma once
#include <ATen/core/Tensor.h>

#include <utility>

#include "model/gpt_config.h"
#include "model/parallel_linear.h"

namespace loom::model {

class ParallelMlp {
 public:
  ParallelMlp(const GptConfig& config, int layer, runtime::CommunicatorPtr tp,
              const at::TensorOptions& options);
  /// x [s(/t), b, h] -> (fc2 output [s(/t), b, h] before its bias, fc2 bias [h]).
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& x) const;
  void collect(ParamList& out) const;

 private:
  ColumnParallelLinear fc1_;
  RowParallelLinear fc2_;
};

}  // namespace loom::model
