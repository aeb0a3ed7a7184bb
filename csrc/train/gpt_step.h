// One step of this rank's GPT chunks over the pipeline schedule (train/pipeline_schedule.h):
// how a micro-batch enters a chunk, how the last stage turns per-token losses into the
// step's loss, and the reductions that bring the loss to every rank. Every tensor stays on
// the run's device; nothing here waits for the device (no .item()).
//
// Loss normalisation (Megatron's, with eod masking): a micro-batch contributes
// Σ masked token losses · d / (loss-mask tokens of the whole global batch), so gradients do
// not depend on how the global batch is split into micro-batches and data-parallel ranks
// (the data-parallel gradient reduction averages over d).
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

#include "model/dropout_context.h"
#include "model/gpt_stage.h"
#include "runtime/process_groups.h"
#include "train/micro_batches.h"
#include "train/pipeline_schedule.h"
#include "train/run_settings.h"

namespace loom::train {

/// The pipeline schedule of a step of `config`'s model at `layout`: activations
/// [s/t under sequence parallelism, else s, micro_batch, hidden] of the model's dtype on
/// `device`.
ScheduleConfig gpt_schedule(const model::GptConfig& config, const Layout& layout,
                            at::Device device, bool forward_only);

class GptStep {
 public:
  /// `chunks` and `groups` must outlive the step.
  GptStep(const std::vector<model::GptStage>& chunks, runtime::ProcessGroups& groups,
          const Layout& layout);

  /// Forward and backward of one training step over this data-parallel rank's m micro-batches,
  /// dropout keyed by `dropout` (seed, step, global batch); the loss is multiplied by
  /// `loss_scale` (fp16: the scaler's float64 0-dim device tensor; undefined for none) before
  /// backward; `after_backward` runs after each micro-batch's
  /// backward. Returns the global batch's mean loss (unscaled), a one-element float64 tensor on
  /// the device, the same on every rank. Collective over the data and pipeline groups.
  at::Tensor train(const std::vector<MicroBatch>& batches, const model::DropoutContext& dropout,
                   const at::Tensor& loss_scale, const std::function<void()>& after_backward);

  /// Forward only, no dropout: [Σ masked token loss, Σ loss-mask tokens] of `batches` as a
  /// float64 [2] tensor on the device, nonzero on the last pipeline stage only.
  at::Tensor evaluate(const std::vector<MicroBatch>& batches);

  /// `totals` of evaluate() summed over the data-parallel ranks and brought to every pipeline
  /// stage (collective).
  at::Tensor reduce_totals(at::Tensor totals);

 private:
  at::Tensor forward(int chunk, const MicroBatch& mb, const at::Tensor& input,
                     const model::DropoutContext& dropout, bool evaluation);

  const std::vector<model::GptStage>& chunks_;
  runtime::ProcessGroups& groups_;
  Layout layout_;
  bool last_stage_;
  ScheduleConfig train_schedule_, eval_schedule_;
  at::Tensor token_scale_;  ///< d / (global batch tokens), float32 0-dim, per training step
  at::Tensor loss_scale_;  ///< fp32 0-dim during train() with a scaler, else undefined
};

}  // namespace loom::train
