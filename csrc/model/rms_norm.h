// RMSNorm (Zhang & Sennrich 2019), the Llama family's normalisation: y = x / sqrt(mean(x²) + eps)
// · weight over the last dimension, no mean subtraction and no bias. The ATen composition (the
// fused kernel is loom::ops::rms_norm, chosen by model.persist_layer_norm in layer_norm.h): the statistic and the scaling run in float32 and the result is cast back to
// x's dtype before the weight multiplies it, as transformers' LlamaRMSNorm does, so fp32 and
// bf16 models match it.
#pragma once
#include <ATen/core/Tensor.h>

namespace loom::model {

/// x [..., h] of any floating dtype, weight [h] -> [..., h] (the dtype of weight · x).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace loom::model
