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
#include <vector>

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

/// The fp32 tensors of one multi-tensor update: element k of each list belongs together
/// (fp32, same shape and device, contiguous).
struct AdamWTensors {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
};

/// Whether ATen's fused AdamW kernel (_fused_adamw_, torch.optim.AdamW(fused=True)) is the
/// multi-tensor update on `device`: CUDA. (ATen has it for CPU too, but a CPU run must equal a
/// run on the stand-in device bit for bit, docs/design/devices.md, so CPU and other devices take
/// the for-each path.)
bool fused_adamw_supported(at::Device device);

enum class AdamWKernel {
  kAuto,       ///< ATen's fused kernel where fused_adamw_supported, else for-each
  kForEach,    ///< ATen's _foreach_ ops in adamw_update's operation order: equal to it bit for bit on CPU
  kAtenFused,  ///< ATen's _fused_adamw_ (CPU or CUDA)
};

/// The update of adamw_update on every tensor of `t` in multi-tensor kernels. kForEach runs
/// adamw_update's operations, each over the whole list (bit for bit adamw_update on CPU).
/// kAtenFused is one kernel, equal to adamw_update within fp32 rounding: it forms the first
/// moment with a lerp (m + (1 − β1)(g − m)) instead of β1·m + (1 − β1)·g and may contract
/// multiply-adds. Throws std::invalid_argument like adamw_update.
void fused_adamw_update(AdamWTensors& t, int64_t step, double lr, const AdamWConfig& cfg, bool decay,
                        AdamWKernel kernel = AdamWKernel::kAuto);

}  // namespace loom::train::optim
