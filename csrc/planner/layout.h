// One candidate training layout: how the model and the batch are split over the GPUs and which
// memory-saving options are on. Field meanings follow NeMo's recipe keys (docs/design/conventions.md) and
// the rank order of docs/design/parallel_layout.md (tp fastest, then dp, then pp).
#pragma once
#include <string>

#include "rules/layout_rules.h"
#include "rules/layout_terms.h"

namespace loom::planner {

// The recipe's vocabulary (rules/layout_terms.h). Precision sets the bytes per parameter of
// docs/design/parallel_layout.md, "Distributed optimizer" (bf16 params + fp32 grads: 18 → 6 + 12/d;
// fp16: 20 → 4 + 16/d; fp32, as CPU ranks train: 16 → 8 + 8/d) and the bytes of an activation
// element (2, or 4 for fp32).
using loom::Precision;
using loom::RecomputeGranularity;
using loom::RecomputeMethod;

/// Bytes of one activation element: 2 for bf16/fp16, 4 for fp32.
double element_bytes(Precision p);

struct Layout {
  int tp = 1;            ///< tensor_model_parallel_size t
  int pp = 1;            ///< pipeline_model_parallel_size p
  int vp = 1;            ///< model chunks per pipeline stage (virtual_pipeline_model_parallel_size; 1 = none)
  int dp = 1;            ///< data-parallel size d = world / (t·p)
  int micro_batch = 1;   ///< micro_batch_size b
  bool sequence_parallel = false;
  RecomputeGranularity recompute = RecomputeGranularity::kNone;
  RecomputeMethod method = RecomputeMethod::kUniform;
  int recompute_layers = 0;  ///< activations_checkpoint_num_layers (full only)
  bool distributed_optimizer = false;
  /// Megatron-Core's uneven stages (model.num_layers_in_first/last_pipeline_stage): layers of
  /// the first / last pipeline stage, 0 for an even share (docs/design/parallel_layout.md,
  /// "Uneven stages").
  int first_stage_layers = 0, last_stage_layers = 0;

  bool uneven() const { return first_stage_layers > 0 || last_stage_layers > 0; }
  /// The pipeline split of `num_layers` layers that rules/layout_rules.h checks and cuts.
  rules::PipelineSplit split(int num_layers) const;
  /// Transformer layers of pipeline stage `stage` (the layout must be legal).
  int stage_layers(int num_layers, int stage) const;

  /// Short description, e.g. "t8 p8 v3 d16 b1 sp sel dopt"; uneven stages add their set sizes
  /// after p ("t1 p8 f5 l3 v1 …": 5 layers first, 3 last).
  std::string describe() const;
  /// "none", "selective", "full-uniform-1", "full-block-3".
  std::string recompute_name() const;
};


}  // namespace loom::planner
