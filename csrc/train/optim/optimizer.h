// The training step's optimizer: fp32 gradient accumulation, gradient finalisation, loss-scale
// handling, global norm and clipping, and AdamW on fp32 main parameters, for either layout
// (docs/design/parallel_layout.md, "Gradient finalisation" and "Distributed optimizer"):
//   - plain ("fused_adam"): every data-parallel rank holds the whole reduced gradient and the
//     whole optimizer state; fp32 main parameters are the parameters themselves when the model
//     is fp32, otherwise fp32 copies (bf16/fp16 models).
//   - distributed ("distributed_fused_adam", ZeRO-1): the gradient buffer is reduce-scattered;
//     each data-parallel rank keeps fp32 main parameters and moments for its 1/d of every bucket,
//     updates them, and the updated shards are all-gathered into the model-dtype parameters.
// Both give the same parameters up to the rounding of the reductions.
//
// Use per iteration:  start_iteration(m) (or zero_grad()); for each micro-batch { forward;
// (loss·scale).backward(); accumulate_grads(); }  result = step(lr, scaler).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/process_groups.h"
#include "train/optim/adamw.h"
#include "train/optim/grad_buffer.h"
#include "train/optim/loss_scaler.h"
#include "train/optim/optimizer_state.h"
#include "model/parameter.h"

namespace loom::train::optim {

class OverlappedGradReduction;

struct OptimizerOptions {
  AdamWConfig adamw;
  /// ZeRO-1 sharding over the data-parallel group (model.optim.name: distributed_fused_adam).
  bool distributed = false;
  /// Gradient bucket size for the data-parallel collectives (bytes of fp32).
  int64_t bucket_bytes = 40'000'000;
  /// trainer.gradient_clip_val; <= 0 disables clipping (the norm is still computed).
  double clip_grad = 1.0;
  /// model.optim.overlap_grad_sync: each bucket's data-parallel collective starts inside the
  /// last micro-batch's backward (grad_overlap.h) in iterations begun with start_iteration().
  /// Same gradients, bit for bit.
  bool overlap_grad_reduce = false;
  /// Multi-tensor AdamW per gradient bucket and weight-decay group (adamw.h, fused_adamw_update):
  /// on CUDA ATen's fused kernel, the model copies written by one _foreach_copy_ and the clipping
  /// norm from one _foreach_norm (equal to the per-tensor path within fp32 rounding); elsewhere
  /// for-each ops in the per-tensor order (bit for bit on CPU).
  bool fused_adamw = false;
  /// model.optim.overlap_param_sync, distributed optimizer only: step() starts one parameter
  /// all-gather per bucket, in the order the next forward reads them (the first layers' buckets
  /// first), and returns. They are waited for before the model is next read: per bucket by the
  /// forward when set_forward_waits_for_params(true) (train/param_gather_wait.h), otherwise all
  /// at start_iteration(); and all at zero_grad(), step(), state_dict(), load_state_dict(), or
  /// by the caller (wait_for_params) before evaluation and checkpoints. Same parameters, bit for
  /// bit.
  bool overlap_param_gather = false;
};

/// A step's outcome read back to the host (StepResult::read()).
struct StepValues {
  float grad_norm = 0.0f;
  bool skipped = false;
  double clip_coefficient = 1.0;
  double loss_scale = 1.0;
  double grad_sync_s = 0.0;
};

/// A step's outcome as 0-dim tensors on the run's device, so that step() never waits for the
/// device (docs/design/devices.md, "Host waits"): the step log reads them at its log interval.
struct StepResult {
  /// float32: global L2 norm of the finalised, unscaled gradients before clipping (the same
  /// value on every rank); NaN when the loss scaler found an inf/NaN gradient.
  at::Tensor grad_norm;
  /// bool: no update (parameters, moments and step count unchanged), on an inf/NaN gradient
  /// (fp16 loss scaling) or a non-finite norm.
  at::Tensor skipped;
  at::Tensor clip_coefficient;  ///< float64: applied to the gradients (1 when not clipped)
  at::Tensor loss_scale;        ///< float64: the scaler's scale after its update (1 without one)
  /// Host seconds step() spent finishing the data-parallel gradient reduction (what backward
  /// did not hide; on a device, the time to queue it). tools/bench_step.py reads it.
  double grad_sync_s = 0.0;

  /// [grad_norm, skipped, clip_coefficient, loss_scale] as one float64 [4] device tensor, the
  /// column order read() and the step log use (no wait).
  at::Tensor values() const;
  /// The values on the host (waits for the device).
  StepValues read() const;
};

class Optimizer {
 public:
  /// Builds the plain or distributed optimizer for this rank's parameters. Parameter names must
  /// be unique; with `distributed`, all parameters must share one dtype. Throws
  /// std::invalid_argument naming the parameter or option.
  static std::unique_ptr<Optimizer> create(model::ParamList params,
                                           std::shared_ptr<runtime::ProcessGroups> groups,
                                           OptimizerOptions options);
  virtual ~Optimizer();

  /// Zeros the fp32 gradient buffer and drops every param.grad.
  void zero_grad();
  /// zero_grad() for an iteration of `num_microbatches` backward passes per parameter; with
  /// options.overlap_grad_reduce it also arms the overlapped reduction (grad_overlap.h), whose
  /// hooks then accumulate each gradient as autograd produces it (accumulate_grads() finds
  /// nothing left). With set_forward_waits_for_params(true) it leaves the parameter all-gathers
  /// in flight for the forward. Throws std::invalid_argument for num_microbatches < 1.
  void start_iteration(int num_microbatches);
  /// Adds every param.grad into the fp32 buffer and drops it: call after each micro-batch backward.
  void accumulate_grads();

  /// One training step after the last micro-batch: finalises the gradients (grad_finalize.h);
  /// with a `scaler`, unscales them by 1/scale, checks all ranks for inf/NaN, updates the scaler
  /// and skips the update on overflow; computes the global norm (grad_norm.h), clips to
  /// options.clip_grad, applies AdamW at `lr` (weight decay only where param.weight_decay) and
  /// writes the new values into the model parameters. Without a scaler a non-finite norm also
  /// skips the update (the loop decides whether to stop). Collective over all ranks.
  StepResult step(double lr, LossScaler* scaler = nullptr);

  /// Completes the parameter all-gathers step() left in flight (overlap_param_gather); a no-op
  /// otherwise. Collective order is fixed at step(), so this does not communicate itself.
  void wait_for_params();
  /// Completes, in issue order, the all-gathers up to the last one holding a parameter of
  /// params()[first, end), and copies them into the parameters; the later ones stay in flight.
  /// A no-op when none is pending. Throws std::out_of_range unless first <= end <= params().size().
  void wait_for_params_of(size_t first, size_t end);
  /// Bucket all-gathers still in flight (0 without overlap_param_gather).
  virtual int param_gathers_pending() const { return 0; }
  /// The caller's forward waits for each part's parameters (wait_for_params_of) before reading
  /// them, so start_iteration() need not wait for all of them (train/param_gather_wait.h).
  void set_forward_waits_for_params(bool on) { forward_waits_for_params_ = on; }

  /// Successful updates so far (reads the device's count: waits for the device).
  int64_t step_count() const;
  /// Buckets whose data-parallel collective started inside the last iteration's backward
  /// (0 without overlap_grad_reduce).
  int buckets_started_in_backward() const;
  bool distributed() const { return options_.distributed; }
  GradBuffer& grads() { return *grads_; }
  const model::ParamList& params() const { return params_; }
  const OptimizerOptions& options() const { return options_; }

  /// Whole-parameter fp32 state (see OptimizerState), identical in format for both layouts, so a
  /// checkpoint can be restored with another data-parallel size or layout. Collective over the
  /// data-parallel group for the distributed optimizer. Tensors are copies.
  OptimizerState state_dict();
  /// Restores main parameters, moments and step, then writes the main parameters into the
  /// model parameters. Throws std::runtime_error naming the missing or mismatched entry.
  void load_state_dict(const OptimizerState& state);

 protected:
  /// A contiguous run of one parameter's elements that this rank updates, with its fp32 state.
  struct Piece {
    size_t param = 0;          ///< index into params()
    int64_t param_offset = 0;  ///< first element covered, in the flattened parameter
    int64_t numel = 0;
    at::Tensor main, grad, exp_avg, exp_avg_sq;  ///< fp32, all the same shape
    bool main_is_param = false;  ///< `main` is the fp32 model parameter itself (plain, fp32)
  };

  Optimizer(model::ParamList params, std::shared_ptr<runtime::ProcessGroups> groups,
            OptimizerOptions options);
  /// Copies the model parameters into every piece's main tensor (unless they alias).
  void init_main_from_params();

  /// Writes the pieces' main values into the model parameters (all-gather when sharded).
  /// `async`: may leave the all-gathers in flight for finish_publish().
  virtual void publish_params(bool async = false) = 0;
  /// Completes what publish_params(true) left in flight (default: nothing).
  virtual void finish_publish() {}
  /// Completes what the parameters [first, end) need of it (see wait_for_params_of).
  virtual void finish_publish_of(size_t /*first*/, size_t /*end*/) {}
  /// Whole-parameter fp32 copies of one kind of state (0 main, 1 exp_avg, 2 exp_avg_sq), in
  /// parameter order.
  virtual std::vector<at::Tensor> gather_state(int kind) = 0;
  /// The group over which norms and overflow flags are reduced.
  runtime::Communicator& norm_group();

  model::ParamList params_;
  std::shared_ptr<runtime::ProcessGroups> groups_;
  OptimizerOptions options_;
  std::unique_ptr<GradBuffer> grads_;
  std::unique_ptr<OverlappedGradReduction> overlap_;  ///< with options.overlap_grad_reduce
  std::vector<Piece> pieces_;
  bool forward_waits_for_params_ = false;  ///< set_forward_waits_for_params
  /// Successful updates so far: float32 0-dim on the device (AdamW's state step), advanced by
  /// the device when an update is not skipped.
  at::Tensor steps_;

 private:
  /// AdamW on every piece: per piece, or with options.fused_adamw one kernel per group; `skip`
  /// (bool 0-dim on the device) leaves everything unchanged.
  void update_pieces(double lr, const at::Tensor& skip);
  struct FusedGroup {
    AdamWTensors tensors;
    bool decay = false;
  };
  std::vector<FusedGroup> fused_groups_;  ///< (bucket, weight decay) groups, built on first use
};

}  // namespace loom::train::optim
