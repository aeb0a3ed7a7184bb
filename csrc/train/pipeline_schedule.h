// Pipeline schedules of one training (or evaluation) step (Narayanan et al. 2021;
// docs/design/parallel_layout.md, "Pipeline schedules"):
//  - no pipelining (p = 1): forward and backward of each micro-batch in turn (gradient
//    accumulation);
//  - 1F1B: on stage r, min(p − r − 1, m) warm-up forwards, then one forward / one backward,
//    then cool-down backwards; at most p micro-batches stashed on stage 0;
//  - interleaved 1F1B with v model chunks per stage: chunk c of stage r holds virtual stage
//    c·p + r; needs m % p == 0.
// Activations [s/t, b, h] (or [s, b, h] without SP) travel between neighbouring stages with
// non-blocking sends and blocking receives on the stage's pipeline links, one communicator per
// direction (runtime/pipeline_links.h: safe with NCCL's in-order, rendezvous point-to-point);
// messages carry no tags, each direction's messages are received in the order they were sent.
// An output's storage is released as soon as its send completed (the autograd node stays;
// backward starts from it with the received gradient).
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

#include "runtime/pipeline_links.h"

namespace loom::train {

struct ScheduleConfig {
  int num_microbatches = 1;  ///< m
  int virtual_stages = 1;    ///< v (model chunks per pipeline stage)
  bool forward_only = false; ///< evaluation: no backward, no stashing
  /// Shape, dtype and device of the activation exchanged between stages (identical for every
  /// micro-batch and chunk), e.g. {s/t, b, h} in the model's dtype on the stage's device:
  /// receive buffers are allocated so.
  std::vector<int64_t> activation_shape;
  at::ScalarType activation_dtype = at::kFloat;
  at::Device activation_device = at::kCPU;
  /// Release an output's storage once its send completed (Megatron's
  /// deallocate_output_tensor). Only safe when no backward node saved that output.
  bool free_sent_activations = true;
  /// Called after each micro-batch's backward on this stage (e.g. to fold .grad into fp32
  /// main gradients).
  std::function<void()> after_backward;
};

/// Runs model chunk `chunk` on micro-batch `microbatch`. `input` is the activation received
/// from the previous virtual stage (a leaf that requires grad), undefined on virtual stage 0.
/// Returns the activation for the next virtual stage, or, on the last virtual stage, the
/// micro-batch's scalar loss (already normalised so that gradients sum correctly).
using ForwardStep = std::function<at::Tensor(int chunk, int microbatch, const at::Tensor& input)>;

struct ScheduleStats {
  int max_stashed = 0;      ///< most micro-batches holding activations at once on this stage
  int forwards = 0;         ///< forward steps run (m·v)
  int backwards = 0;        ///< backward steps run
};

struct ScheduleResult {
  /// Detached scalar losses of each micro-batch, on the last pipeline stage only (empty elsewhere).
  std::vector<at::Tensor> losses;
  ScheduleStats stats;
};

/// Runs one step's forward (and backward) passes over `pipeline` (this rank's pipeline links;
/// size 1 = no pipelining). Gradients accumulate into the parameters' .grad. Throws
/// std::invalid_argument for an interleaved schedule with m % p != 0, and whatever the forward
/// step or the communication throws.
ScheduleResult run_pipeline_schedule(const ScheduleConfig& config, runtime::PipelineLinks& pipeline,
                                     const ForwardStep& forward_step);

/// The operations a stage performs, in order: each a forward or a backward of micro-batch
/// `microbatch` through model chunk `chunk` (backward visits the chunks in reverse); exposed for
/// tests of the schedule's shape.
struct ScheduledOp {
  bool forward;
  int chunk;
  int microbatch;
};
std::vector<ScheduledOp> schedule_order(int pipeline_size, int pipeline_rank, int num_microbatches,
                                        int virtual_stages, bool forward_only);

}  // namespace loom::train
