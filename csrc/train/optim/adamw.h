// AdamW (Loshchilov & Hutter, decoupled weight decay) on fp32 tensors, the update of
// torch.optim.AdamW and of apex FusedAdam in adam_w_mode (NeMo's fused_adam /
// distributed_fused_adam), in the same operation order as torch::optim::AdamW:
//   p ← p·(1 − lr·wd)                       (only for parameters with weight decay)
//   m ← β1·m + (1 − β1)·g
//   v ← β2·v + (1 − β2)·g²
//   p ← p − lr/(1 − β1^t) · m / (√v / √(1 − β2^t) + ε)
// with t the 1-based step number.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace loom::train::optim {

struct AdamWConfig {
  double beta1 = 0.9;          ///< model.optim.betas[0]
  double beta2 = 0.999;        ///< model.optim.betas[1]
  double eps = 1e-8;           ///< model.optim.eps
  double weight_decay = 0.01;  ///< model.optim.weight_decay
};

/// Throws std::invalid_argument naming the field for betas outside [0, 1), eps <= 0 or
/// weight_decay < 0.
void validate(const AdamWConfig& cfg);

/// One AdamW update in place. `param`, `grad`, `exp_avg`, `exp_avg_sq`: fp32, same shape and
/// device. `step`: 1-based count including this update. `decay`: apply weight decay.
/// Throws std::invalid_argument on dtype/shape mismatch or step < 1.
void adamw_update(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                  at::Tensor& exp_avg_sq, int64_t step, double lr, const AdamWConfig& cfg,
                  bool decay);

}  // namespace loom::train::optim
