// Memory per GPU of a pipeline stage: what Loom allocates at the step's peak
// (planner/memory_breakdown.h: model states, stored activations of the in-flight micro-batches,
// logits and cross-entropy temporaries, the recompute working set, gradients before accumulation,
// communication buffers, optimizer workspace) grouped into the report's terms, plus a stated
// reserve. The paper's per-layer formula (layer_activation_bytes) is kept for what Megatron
// stores and Korthikanti et al. publish. Formulas: docs/design/sp_sar.md ("Activation memory per
// layer", 1F1B and interleaving factors), docs/design/parallel_layout.md and docs/planner.md
// ("Memory model"). All results are bytes per GPU.
#pragma once
#include <vector>

#include "planner/layout.h"
#include "planner/model_shape.h"
#include "planner/training_setup.h"

namespace loom::planner {

/// Stored activation bytes of one transformer layer for one micro-batch of b samples as Megatron
/// stores them, 2-byte activations and 1-byte dropout masks (Korthikanti et al. 2022, Table 2,
/// generalised to ffn ≠ 4h; Loom's own: loom_layer_activation_bytes in memory_breakdown.h):
///   sbh·(r + (8 + 4·ffn/h)/t + 5as/(ht)),  r = 10 (t = 1 or no SP: replicated part) or 10/t (SP)
/// (the split part is 2·((a+2g)·d + a·d + fc1_width + ffn)/h in general: grouped-query Q, K, V at
/// their widths, SwiGLU's gate and up as fc1's output; RMSNorm keeps its input as LayerNorm does)
/// which is sbh(34 + 5as/h) unparallelised, sbh(10 + 24/t + 5as/(ht)) under TP and
/// sbh(34/t + 5as/(ht)) under TP+SP. Selective recompute drops the 5as/(ht) term; full recompute
/// keeps only the layer input 2sbh (2sbh/t under SP). With the fused attention core
/// (`fused_attention`, model.use_flash_attention) the 5as/(ht) term becomes 4a/(ht): the
/// kernel stores its fp32 log-sum-exp per row and head instead of the s×s scores.
double layer_activation_bytes(const ModelShape& m, int micro_batch, int tp, bool sp, RecomputeGranularity r,
                              bool fused_attention = false);

/// Micro-batch chunks whose activations stage `stage` holds at peak: 1F1B holds min(m, p − r)
/// micro-batches; the interleaved schedule with v chunks holds min(m·v, 2(p − r − 1) + (v − 1)p + 1)
/// chunks of L/(pv) layers (Megatron's warm-up count + 1), i.e. L·(1 + (p−1)/(pv)) layers on stage 0;
/// with m = p every forward runs first: m·v chunks on every stage.
int in_flight_chunks(int pp, int vp, int num_micro_batches, int stage);

/// Parameters of one transformer layer held by one TP rank (ModelShape::layer_parameters): for
/// GPT (4h² + 2h·ffn + 3h + ffn)/t for the split weights and biases plus 6h replicated
/// (row-parallel biases, two LayerNorms); for Llama (h·(a+2g)d + a·d·h + 3h·ffn)/t plus 2h (the
/// two RMSNorm weights).
double layer_params_per_rank(const ModelShape& m, int tp);

/// Bytes per parameter for weights + grads + optimizer as Loom allocates them
/// (memory_breakdown.h, model_states): bf16 and fp16 18 or 6 + 12/d; fp32 16 or 8 + 12/d.
double bytes_per_param(Precision p, bool distributed_optimizer, int dp);

/// One GPU's memory on one stage, by term (bytes), at the step's peak (memory_breakdown.h).
struct MemoryTerms {
  double weights_optimizer = 0;  ///< model states: params, fp32 grad buffer, main copies, moments
  double activations = 0;        ///< stored activations held at the peak (all in-flight chunks)
  double embedding_logits = 0;   ///< logits and cross-entropy temporaries (last stage)
  double transient = 0;          ///< recompute working set, gradients before accumulation,
                                 ///< communication buffers and optimizer workspace at the peak
  double reserve = 0;            ///< stated reserve (reserve_gib + fragmentation × capacity)
  double total() const { return weights_optimizer + activations + embedding_logits + transient + reserve; }
  /// Name of the largest term other than the reserve: the term that binds when it does not fit.
  const char* largest_term() const;
};

/// Memory of stage `stage` (0-based) of `layout` for `capacity_bytes` of device memory (sets the
/// reserve): stage_breakdown's peak (its own layer count, in-flight micro-batches, embedding on
/// stage 0, logits/loss on stage p − 1) plus the reserve. Layout must already be valid
/// (divisibility checked by the caller).
MemoryTerms stage_memory(const ModelShape& m, const TrainingSetup& setup, const Layout& layout,
                         int stage, double capacity_bytes);

/// One pipeline stage's memory with what it follows from.
struct StageMemory {
  int stage = 0;
  int layers = 0;      ///< transformer layers the stage holds
  int in_flight = 0;   ///< micro-batch chunks whose activations it holds at peak (in_flight_chunks)
  MemoryTerms terms;
};

/// Every stage of `layout`, stage 0 first (the planner's per-stage output; docs/planner.md).
std::vector<StageMemory> every_stage_memory(const ModelShape& m, const TrainingSetup& setup, const Layout& layout,
                                            double capacity_bytes);

/// The stage needing the most memory (first, last, or — when p > 2 — stage 1) and its terms.
struct WorstStage {
  int stage = 0;
  MemoryTerms terms;
};
WorstStage worst_stage_memory(const ModelShape& m, const TrainingSetup& setup, const Layout& layout,
                              double capacity_bytes);

}  // namespace loom::planner

namespace loom::planner {
/// Parameters held by one GPU of stage `stage`: its layers plus the word embedding and the
/// position table (first stage; none with RoPE) and the final norm and the output layer (last
/// stage: output_layer_params). The vocabulary is split t ways (padded for t).
double stage_params(const ModelShape& m, const Layout& layout, int stage);
/// The learned position table, max_position_embeddings·h (0 with RoPE); on the first stage.
double position_table_params(const ModelShape& m);
/// The last stage's output-layer shard V/t·h: the model's own weight when untied, the tied
/// embedding's copy when p > 1; 0 for a tied embedding on one stage (the embedding itself).
double output_layer_params(const ModelShape& m, const Layout& layout);
}  // namespace loom::planner
