// Memory per GPU of a pipeline stage: weights + gradients + optimizer state, stored activations
// of the in-flight micro-batches, embedding/logits activations on the end stages, the transient
// working set of a recomputed backward, and a stated reserve. Formulas: docs/design/sp_sar.md ("Activation
// memory per layer", 1F1B and interleaving factors) and docs/design/parallel_layout.md (bytes per parameter).
// All results are bytes per GPU.
#pragma once
#include <vector>

#include "planner/layout.h"
#include "planner/model_shape.h"
#include "planner/training_setup.h"

namespace loom::planner {

/// Stored activation bytes of one transformer layer for one micro-batch of b samples
/// (Korthikanti et al. 2022, Table 2, generalised to ffn ≠ 4h):
///   sbh·(r + (8 + 4·ffn/h)/t + 5as/(ht)),  r = 10 (t = 1 or no SP: replicated part) or 10/t (SP)
/// which is sbh(34 + 5as/h) unparallelised, sbh(10 + 24/t + 5as/(ht)) under TP and
/// sbh(34/t + 5as/(ht)) under TP+SP. Selective recompute drops the 5as/(ht) term; full recompute
/// keeps only the layer input 2sbh (2sbh/t under SP). With the fused attention core
/// (`fused_attention`, model.use_flash_attention) the 5as/(ht) term becomes 4a/(ht): the
/// kernel stores its fp32 log-sum-exp per row and head instead of the s×s scores.
double layer_activation_bytes(const ModelShape& m, int micro_batch, int tp, bool sp, RecomputeGranularity r,
                              bool fused_attention = false);

/// Micro-batch chunks whose activations stage `stage` holds at peak: 1F1B holds min(m, p − r)
/// micro-batches; the interleaved schedule with v chunks holds min(m·v, 2(p − r − 1) + (v − 1)p + 1)
/// chunks of L/(pv) layers (Megatron's warm-up count + 1), i.e. L·(1 + (p−1)/(pv)) layers on stage 0.
int in_flight_chunks(int pp, int vp, int num_micro_batches, int stage);

/// Parameters of one transformer layer held by one TP rank: (4h² + 2h·ffn + 3h + ffn)/t for the
/// split weights and biases plus 6h replicated (row-parallel biases, two LayerNorms).
double layer_params_per_rank(const ModelShape& m, int tp);

/// Bytes per parameter for weights + grads + optimizer (docs/design/parallel_layout.md, "Distributed
/// optimizer"): bf16 18 or 6 + 12/d; fp16 20 or 4 + 16/d; fp32 16 or 8 + 8/d.
double bytes_per_param(Precision p, bool distributed_optimizer, int dp);

/// One GPU's memory on one stage, by term (bytes).
struct MemoryTerms {
  double weights_optimizer = 0;  ///< params + grads + optimizer state (embedding on end stages)
  double activations = 0;        ///< stored activations of the stage's layers, all in-flight chunks
  double embedding_logits = 0;   ///< embedding dropout masks; final LN, logits input, fp32 logits
  double transient = 0;          ///< backward working set: recomputed layers, attention recompute
  double reserve = 0;            ///< stated reserve (reserve_gib + fragmentation × capacity)
  double total() const { return weights_optimizer + activations + embedding_logits + transient + reserve; }
  /// Name of the largest term other than the reserve: the term that binds when it does not fit.
  const char* largest_term() const;
};

/// Memory of stage `stage` (0-based) of `layout` for `capacity_bytes` of device memory (sets the
/// reserve): the stage's own layer count (uneven stages: Layout::stage_layers), its in-flight
/// micro-batches, the embedding on stage 0 and the logits/loss on stage p − 1. Layout must
/// already be valid (divisibility checked by the caller).
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
/// Parameters held by one GPU of stage `stage`: its layers plus the word and position
/// embeddings (first stage) and the final LayerNorm and, when p > 1, the tied output embedding
/// copy (last stage). The vocabulary is split t ways (rounded up).
double stage_params(const ModelShape& m, const Layout& layout, int stage);
}  // namespace loom::planner
