// AdamW (Loshchilov & Hutter, decoupled weight decay) on fp32 tensors, the update of
// torch.optim.AdamW and of apex FusedAdam in adam_w_mode (NeMo's fused_adam /
// distributed_fused_adam), in the same operation order as torch::optim::AdamW:
//   p ← p·(1 − lr·wd)                       (only for parameters with weight decay)
//   m ← β1·m + (1 − β1)·g
//   v ← β2·v + (1 − β2)·g²
//   p ← p − lr/(1 − β1^t) · m / (√v / √(1 − β2^t) + ε)
// with t the 1-based step number.
//
// Whether a step updates at all (fp16 overflow, a non-finite norm) and the step count stay on
// the device (AdamWStep), so that the training step never waits for it (docs/design/devices.md,
// "Host waits"): a skipped update runs the same operations with factors that change nothing
// (β → 1, step size → 0) on gradients the caller has zeroed.
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

/// One update's step-dependent inputs, on the tensors' device.
struct AdamWStep {
  double lr = 0.0;
  /// float32 0-dim: the 1-based step count including this update (left as it was when skipped;
  /// values below 1 are read as 1).
  at::Tensor step;
  /// bool 0-dim: true leaves parameters and moments exactly as they were. The gradients must
  /// then be finite (the optimizer zeroes them), since they still pass through the arithmetic.
  at::Tensor skip;
};

/// An AdamWStep with a host step count and no skip, on `device` (tests, single updates).
AdamWStep adamw_step(int64_t step, double lr, at::Device device);

/// One AdamW update in place. `param`, `grad`, `exp_avg`, `exp_avg_sq`: fp32, same shape and
/// device. `decay`: apply weight decay. Throws std::invalid_argument on dtype/shape mismatch or
/// an undefined step/skip tensor.
void adamw_update(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                  at::Tensor& exp_avg_sq, const AdamWStep& step, const AdamWConfig& cfg, bool decay);
/// adamw_update at host step `step` (>= 1, else std::invalid_argument), never skipped.
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
/// multiply-adds; it reads `skip` as its found_inf flag. Throws std::invalid_argument like
/// adamw_update.
void fused_adamw_update(AdamWTensors& t, const AdamWStep& step, const AdamWConfig& cfg, bool decay,
                        AdamWKernel kernel = AdamWKernel::kAuto);
/// fused_adamw_update at host step `step` (>= 1), never skipped.
void fused_adamw_update(AdamWTensors& t, int64_t step, double lr, const AdamWConfig& cfg, bool decay,
                        AdamWKernel kernel = AdamWKernel::kAuto);

}  // namespace loom::train::optim
