// The one description of a training run's parallel layout, in the recipe's terms: how the model
// and the batch are split over the ranks and which memory-saving options are on. The recipe
// check and the rules (rules/layout_rules.h), the planner's candidates, the trainer's step, the
// checkpoint converter and the rank map (runtime::ParallelLayout) all hold this type. Field
// meanings follow NeMo's recipe keys (docs/design/conventions.md); the rank order is that of
// docs/design/parallel_layout.md (tp fastest, then dp, then pp). Torch-free.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "rules/layout_terms.h"

namespace loom::rules {
struct PipelineSplit;
}

namespace loom {

/// How activations are recomputed, exactly as the recipe says it (null is kept: the rules tell
/// a missing value from a wrong one).
struct RecomputeSettings {
  RecomputeGranularity granularity = RecomputeGranularity::kNone;  ///< model.activations_checkpoint_granularity
  RecomputeMethod method = RecomputeMethod::kNone;                 ///< model.activations_checkpoint_method
  /// model.activations_checkpoint_num_layers (null = unset): uniform: layers per checkpointed
  /// group; block: layers recomputed per model chunk.
  std::optional<int64_t> num_layers;
  bool full() const { return granularity == RecomputeGranularity::kFull; }
  /// How the model runs full recomputation when the recipe leaves a field null (the model's
  /// defaults, stated here only): a null method is uniform, a null layer count is 1.
  RecomputeMethod method_or_uniform() const {
    return method == RecomputeMethod::kNone ? RecomputeMethod::kUniform : method;
  }
  int num_layers_or_one() const { return static_cast<int>(num_layers.value_or(1)); }
};

struct Layout {
  int tp = 1;  ///< t: model.tensor_model_parallel_size
  int pp = 1;  ///< p: model.pipeline_model_parallel_size
  int vp = 1;  ///< v: model.virtual_pipeline_model_parallel_size, model chunks per stage (null: 1)
  int dp = 1;  ///< d: data-parallel size, trainer.num_nodes × trainer.devices / (t·p)
  int micro_batch = 1;        ///< b: model.micro_batch_size, samples per micro-batch
  int64_t global_batch = 1;   ///< model.global_batch_size, samples per optimizer step
  bool sequence_parallel = false;  ///< model.sequence_parallel (off at t = 1)
  RecomputeSettings recompute;     ///< model.activations_checkpoint_*
  bool distributed_optimizer = false;  ///< model.use_distributed_optimizer (or distributed_fused_adam)
  /// Megatron-Core's uneven stages: model.num_layers_in_first_pipeline_stage and
  /// num_layers_in_last_pipeline_stage, the layers of the first / last pipeline stage; null: an
  /// even share (docs/design/parallel_layout.md, "Uneven stages").
  std::optional<int> first_stage_layers, last_stage_layers;

  /// world = t·p·d.
  int64_t world_size() const { return int64_t(tp) * pp * dp; }
  /// m: micro-batches per pipeline and step, global_batch / (micro_batch·d) (the rules check
  /// that it divides).
  int64_t micro_batches() const { return global_batch / (int64_t(micro_batch) * dp); }
  bool uneven() const { return first_stage_layers.has_value() || last_stage_layers.has_value(); }
  /// The pipeline split of `num_layers` layers that rules/layout_rules.h checks and cuts.
  rules::PipelineSplit split(int64_t num_layers) const;
  /// Transformer layers of pipeline stage `stage` (the layout must be legal).
  int stage_layers(int64_t num_layers, int stage) const;

  /// Short description, e.g. "t8 p8 v3 d16 b1 sp sel dopt"; uneven stages add their set sizes
  /// after p ("t1 p8 f5 l3 v1 …": 5 layers first, 3 last).
  std::string describe() const;
  /// "none", "selective", "full-uniform-1", "full-block-3".
  std::string recompute_name() const;
};

}  // namespace loom
