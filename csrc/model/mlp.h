// The MLP of a GPT or Llama layer, column-parallel fc1 and row-parallel fc2:
//   gelu:        fc2(gelu(fc1(x)))      fc1 [h -> ffn/t], GeLU (tanh approximation) fused with
//                                       fc1's bias (loom::ops::bias_gelu)
//   fast-swiglu: fc2(silu(G x) · (U x)) fc1 holds gate G and up U [h -> 2·ffn/t], fc2 [ffn/t -> h]
// SwiGLU's fc1 rows interleave gate and up one row at a time: [g₀, u₀, g₁, u₁, ...]. A
// contiguous 1/t split of that tensor gives rank r exactly the gate rows G_r and the up rows
// U_r of its ffn/t outputs, and the full tensor (checkpoints, resharding, the gathered
// gradients of the layout tests) is the same for every t: Loom's full tensors are the
// concatenation of contiguous shards, which Megatron-Core's per-rank stacking [G_r; U_r] is
// not. The Hugging Face converter (convert/hf_llama) maps gate_proj / up_proj to and from it.
// model.bias_activation_fusion (default true) runs the activation through loom::ops::bias_gelu
// (with a bias) or loom::ops::swiglu (which reads the interleaved pairs directly); false: ATen
// compositions (gelu of h + bias; silu and mul of the unflattened pairs).
#pragma once
#include <ATen/core/Tensor.h>

#include <utility>

#include "model/dropout_context.h"
#include "model/gpt_config.h"
#include "model/parallel_linear.h"

namespace loom::model {

class ParallelMlp {
 public:
  ParallelMlp(const GptConfig& config, int layer, runtime::CommunicatorPtr tp,
              const at::TensorOptions& options);
  /// x [s(/t), b, h] -> (fc2 output [s(/t), b, h] before its bias, fc2 bias [h] or undefined
  /// without bias). `dropout`: for LoRA adapters' inputs (null: none); `served`: served adapters'
  /// tokens (inference, lora_serving.h; null: none).
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& x, const DropoutContext* dropout = nullptr,
                                            const LoraBatch* served = nullptr) const;
  void collect(ParamList& out) const;

 private:
  Activation activation_;
  bool fused_;  ///< model.bias_activation_fusion
  ColumnParallelLinear fc1_;
  RowParallelLinear fc2_;
};

}  // namespace loom::model
