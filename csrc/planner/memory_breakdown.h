// What one GPU of one pipeline stage holds during a Loom training step, part by part, at the two
// moments the step log measures (train/step_memory.h: the peak allocated from the step's start
// to its end, and what stays allocated after it). Every part follows what Loom's code allocates
// (the file named beside each), so the sum can be checked against the stand-in device's exact
// allocator counts (`loom plan --validate-memory`, planner/memory_validation.h). The reserve
// (context, NCCL, fragmentation) is not allocated by tensors and is not part of either figure:
// planner/memory_model.h adds it. Formulas: docs/planner.md, "Memory model".
// All results are bytes per GPU.
#pragma once
#include <vector>

#include "planner/layout.h"
#include "planner/model_shape.h"
#include "planner/training_setup.h"

namespace loom::planner {

/// Model states, allocated before the first step and kept (train/optim/optimizer.h).
struct ModelStates {
  double parameters = 0;         ///< P × element bytes of the model dtype
  double gradients = 0;          ///< the fp32 main-grad buffer, 4 B × P, each DP bucket padded to d
                                 ///< (distributed optimizer): the gradient buckets (grad_buffer.h)
  double main_params = 0;        ///< fp32 master copies: 4P for bf16/fp16 (none for fp32: the
                                 ///< parameters are their own); the distributed optimizer's 4P/d shard
  double optimizer_moments = 0;  ///< Adam's two fp32 moments: 8P, or 8P/d sharded
  double total() const { return parameters + gradients + main_params + optimizer_moments; }
};

/// The model states of `params` parameters (train/optim/optimizer.h, grad_buffer.h): bf16 and
/// fp16 models 2 + 4 + 4 + 8 = 18 B per parameter, 6 + 12/d with the distributed optimizer (the
/// gradient buffer is fp32 for every model dtype, so fp16 needs no second gradient copy as
/// Megatron's 20 B does); fp32 4 + 4 + 8 = 16 B (the parameters are their own main copy), 8 + 12/d
/// distributed (each rank's main shard is a copy).
ModelStates model_states(double params, Precision precision, bool distributed_optimizer, int dp);

/// What a step allocates above the model states at its peak.
struct PeakParts {
  double activations = 0;    ///< stored activations of the chunks held at that moment
  double recompute = 0;      ///< recompute working set (selective: the attention core re-run;
                             ///< full: the checkpointed layers re-run with their activations)
  double logits = 0;         ///< logits and cross-entropy temporaries (last stage)
  double grads = 0;          ///< model-dtype param.grad of the running backward before it is
                             ///< added into the fp32 buffer (grad_buffer.h, accumulate())
  double communication = 0;  ///< collective buffers alive then: packed all-reduces, reduce-scatter
                             ///< shards, the distributed optimizer's parameter all-gathers
  double workspace = 0;      ///< optimizer temporaries (adamw.cpp: per tensor or per group)
  double total() const { return activations + recompute + logits + grads + communication + workspace; }
};

/// The moment of the step at which a stage's allocation peaks.
enum class PeakMoment {
  kForward,    ///< the newest micro-batch's forward (last stage: its cross entropy)
  kBackward,   ///< the first backward of the steady state, all in-flight chunks still held
  kOptimizer,  ///< after the last backward: gradient reduction, update, parameter publication
};
const char* to_string(PeakMoment m);

/// One stage's memory at both measured moments.
struct StageBreakdown {
  int stage = 0;
  int layers = 0;     ///< transformer layers the stage holds
  int in_flight = 0;  ///< chunks whose activations it holds at most (in_flight_chunks)
  ModelStates states;
  PeakMoment moment = PeakMoment::kBackward;
  PeakParts at_peak;  ///< the parts at `moment` (the largest of the three)
  /// Allocated after the step beyond the states: parameter all-gathers left in flight for the
  /// next forward (model.optim.overlap_param_sync).
  double after_step_extra = 0;
  double peak() const { return states.total() + at_peak.total(); }
  double after_step() const { return states.total() + after_step_extra; }
};

/// Bytes of one transformer layer's stored activations for one micro-batch of b samples, as Loom
/// stores them (docs/design/sp_sar.md, "What Loom itself stores"; docs/planner.md, "Memory
/// model"). For GPT, per sbh: 8 + 2·ffn/h elements of which 4 are replicated (÷t only under SP)
/// and 4 + 2·ffn/h split t ways, plus 2as/(ht) elements of attention scores (none under
/// selective recompute; as/(ht) without attention dropout; the fused core's fp32 log-sum-exp,
/// 4·a·s·b/t bytes, instead, plus its kept output, 1 sbh/t element), plus the two LayerNorms'
/// fp32 mean and rstd (16 B per token, ÷t under SP). The Llama options change the parts:
/// RMSNorm keeps its input in fp32, its rstd and the normalised tensor (norm_saved_bytes), Q/K/V
/// as saved_qkv_width says, SwiGLU 4·ffn/t instead of 2·ffn/t, the projection input a·d/t.
/// Full recompute keeps the layer input, sbh elements (÷t under SP). No dropout masks: Loom
/// regenerates them. `attention_dropout`: model.attention_dropout > 0.
double loom_layer_activation_bytes(const ModelShape& m, int micro_batch, int tp, bool sp, RecomputeGranularity r,
                                   bool fused_attention, Precision precision, bool attention_dropout = true);

/// Bytes one norm keeps for backward over `tokens` rows (its output, the next GEMM's input, not
/// included): LayerNorm h·e + 8 (input, fp32 mean and rstd); RMSNorm h·(4 + e) + 4 (input in
/// fp32, the normalised tensor, fp32 rstd; model/rms_norm.cpp).
double norm_saved_bytes(const ModelShape& m, double tokens, double element_bytes);

/// Elements per token of Q, K and V as one TP rank's attention core keeps them (model/attention.cpp):
/// the QKV output (a+2g)d/t while a view of it is kept (3h/t for GPT); RoPE's rotated Q (a·d/t)
/// and K (g·d/t); grouped-query attention's K and V expanded to a/t heads (2·a·d/t).
double saved_qkv_width(const ModelShape& m, int tp);

/// RoPE's cos and sin tables of one micro-batch, [b, 1, s, d] each in the model dtype: made once
/// per chunk forward and kept until its backward (0 for learned positions).
double rotary_table_bytes(const ModelShape& m, int micro_batch, Precision precision);

/// The breakdown of stage `stage` (0-based) of a valid `layout`.
StageBreakdown stage_breakdown(const ModelShape& m, const TrainingSetup& setup, const Layout& layout, int stage);

/// Every stage, stage 0 first.
std::vector<StageBreakdown> every_stage_breakdown(const ModelShape& m, const TrainingSetup& setup,
                                                  const Layout& layout);

}  // namespace loom::planner
