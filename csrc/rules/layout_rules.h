// The one set of rules that decides which parallel layouts are legal (docs/design/parallel_layout.md,
// "Ranks and groups" and "Pipeline schedules"; docs/design/sp_sar.md, "Regions"). The recipe check
// (config/validate.cpp), the model (GptConfig::validate, pipeline_stage_layouts), the pipeline
// schedule (schedule_order) and the planner's search (planner::check_layout) all call these
// functions, so a layout is legal for one exactly when it is legal for all. Torch-free.
//
// Each rule reports a Violation naming the recipe field to blame (NeMo's key path), the message
// ("expected …, found …", the recipe checker's style) and the fields it read, so that a caller
// that already rejected one of those fields can skip the dependent rule.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rules/layout.h"
#include "rules/layout_terms.h"
#include "rules/model_shape.h"

namespace loom::rules {

struct Violation {
  std::string field;                ///< recipe key path blamed, e.g. "model.num_attention_heads"
  std::string message;              ///< "expected a multiple of tensor_model_parallel_size (4), found 6"
  std::vector<std::string> reads;   ///< every recipe key the rule read (including `field`)
  std::string text() const { return field + ": " + message; }
};

/// How the transformer layers are cut into pipeline stages: p stages of v model chunks each,
/// evenly, or with Megatron-Core's uneven first and/or last stage
/// (model.num_layers_in_first_pipeline_stage / num_layers_in_last_pipeline_stage; null: that
/// stage takes an even share of what the set ones leave). docs/design/parallel_layout.md,
/// "Uneven stages"; Megatron-Core transformer_config.py / transformer_block.py.
struct PipelineSplit {
  int64_t num_layers = 1;                      ///< L
  int64_t pipeline = 1;                        ///< p
  int64_t virtual_stages = 1;                  ///< v (1 = no interleaving)
  std::optional<int64_t> first_stage_layers;   ///< num_layers_in_first_pipeline_stage
  std::optional<int64_t> last_stage_layers;    ///< num_layers_in_last_pipeline_stage
  bool uneven() const { return first_stage_layers.has_value() || last_stage_layers.has_value(); }
};

/// Layers [first, last) of the global stack (0-based, last exclusive).
struct LayerRange {
  int64_t first = 0, last = 0;
  int64_t size() const { return last - first; }
  bool operator==(const LayerRange& o) const { return first == o.first && last == o.last; }
};

/// A question for the rules: is `layout` legal for `model` on trainer.num_nodes ×
/// trainer.devices ranks (layout.dp is not read: d = world / (t·p))?
struct LayoutQuery {
  int64_t num_nodes = 1, devices = 1;    ///< world = num_nodes × devices
  Layout layout;
  ModelShape model;
  PipelineSplit split() const { return layout.split(model.num_layers); }
};

/// Tensor parallelism and sequence lengths: heads % t, hidden % heads, ffn % t, s % t under
/// sequence parallelism (t > 1 only: with t = 1 it is a no-op), s <= max_position_embeddings,
/// and architecture_violations(m, t).
std::vector<Violation> tensor_parallel_violations(const ModelShape& m, int64_t t, bool sequence_parallel);

/// The Llama-family options (docs/design/llama.md): num_query_groups >= 1 (or 0/null = heads)
/// dividing num_attention_heads and divisible by t (each rank holds whole K/V heads; Megatron-Core
/// requires the same for its plain path; Loom does not replicate K/V heads over ranks when
/// groups < t), kv_channels null or >= 1, rotary_percentage in (0, 1], with rope rotary_base > 0
/// and an even number >= 2 of rotated dimensions per head, and with rope_scaling: rope, factor
/// > 0, 0 < low_freq_factor < high_freq_factor, old_context_len >= 1.
std::vector<Violation> architecture_violations(const ModelShape& m, int64_t t);

/// Pipeline split: v > 1 needs p > 1. Even (neither end stage set): num_layers % (p·v) == 0.
/// Uneven (Megatron-Core's rules): p > 1; each set size >= 1 and a multiple of v; the S stages
/// without a set size share M = num_layers − the set sizes: S = 0 needs M = 0, S > 0 needs
/// M >= 1, M % S == 0 and (M/S) % v == 0.
std::vector<Violation> pipeline_violations(const PipelineSplit& split);
/// The even split's rule (no uneven end stages).
std::vector<Violation> pipeline_violations(int64_t num_layers, int64_t p, int64_t v);

/// Transformer layers of each pipeline stage (p entries summing to num_layers). Throws
/// std::invalid_argument with the violations' text when the split is illegal.
std::vector<int64_t> stage_layer_counts(const PipelineSplit& split);

/// Layers of pipeline stage `stage` of a split already known to be legal (no check: for the
/// planner's inner loops); stage_layer_counts is the checked form.
int64_t stage_layers(const PipelineSplit& split, int64_t stage);

/// The layers of each virtual stage i = k·p + r (chunk k of pipeline stage r), p·v entries in
/// that order, contiguous and covering [0, num_layers): chunk k of stage r holds
/// stage_layer_counts[r] / v layers (Megatron-Core's get_transformer_layer_offset). Even split:
/// [i·L/(p·v), (i+1)·L/(p·v)). Throws like stage_layer_counts.
std::vector<LayerRange> virtual_stage_layer_ranges(const PipelineSplit& split);

/// The largest model chunk's layer count (L/(p·v) for an even split). Throws like stage_layer_counts.
int64_t largest_chunk_layers(const PipelineSplit& split);

/// The interleaved schedule (v > 1) needs num_microbatches % p == 0 (Narayanan et al. 2021, §2.2;
/// docs/design/parallel_layout.md, "Pipeline schedules"). `derivation` says where the count came
/// from in the message (e.g. "global_batch_size/(micro_batch_size*data_parallel_size) = 6/(2*1)").
std::optional<Violation> interleaving_violation(int64_t num_microbatches, int64_t p, int64_t v,
                                                const std::string& derivation = "");

/// World and batch: world % (t·p) == 0; global_batch % (micro_batch·d) == 0; then interleaving.
std::vector<Violation> batch_violations(const LayoutQuery& q);

/// Recompute settings for model chunks of at most `layers_per_chunk` layers: selective takes no
/// method (NeMo's `block` with 0 layers is accepted as "none") and no layer count; full takes
/// uniform with 1..layers_per_chunk layers per checkpointed group, or block with
/// 0..layers_per_chunk recomputed layers (0: nothing recomputed, as Megatron-Core's block method
/// allows). With uneven stages `layers_per_chunk` is the largest chunk's (a smaller chunk takes
/// the count as "all its layers"); `uneven` only changes the message's wording.
std::vector<Violation> recompute_violations(const RecomputeSettings& r, int64_t layers_per_chunk,
                                            bool uneven = false);

/// Every rule above, in a fixed order: batch (world first), tensor, pipeline, recompute (the
/// last only when the pipeline split is legal, since it needs the chunk size).
std::vector<Violation> layout_violations(const LayoutQuery& q);

/// The fused attention core (model.use_flash_attention, docs/design/sp_sar.md "Fused attention"):
/// with it attention_dropout must be 0 (the fused kernel would draw its own mask, not Loom's
/// position-keyed one, so layouts and recompute settings would no longer reproduce each other)
/// and granularity must not be selective (the fused core stores no s×s activations: selective
/// recomputation would save nothing and repeat the attention forward). Without it: no violation.
std::vector<Violation> fused_attention_violations(bool use_flash_attention, double attention_dropout,
                                                  RecomputeGranularity granularity);

/// Throws std::invalid_argument with every violation's text ("field: message", one per line)
/// prefixed by `context` when `violations` is not empty.
void throw_if_any(const std::vector<Violation>& violations, const std::string& context);

}  // namespace loom::rules
