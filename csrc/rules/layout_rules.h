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

#include "rules/layout_terms.h"

namespace loom::rules {

struct Violation {
  std::string field;                ///< recipe key path blamed, e.g. "model.num_attention_heads"
  std::string message;              ///< "expected a multiple of tensor_model_parallel_size (4), found 6"
  std::vector<std::string> reads;   ///< every recipe key the rule read (including `field`)
  std::string text() const { return field + ": " + message; }
};

/// The model dimensions the rules read (recipe model.* keys).
struct ModelDims {
  int64_t num_layers = 1;
  int64_t hidden_size = 1;
  int64_t num_attention_heads = 1;
  int64_t ffn_hidden_size = 4;           ///< resolved (4·hidden when the recipe leaves it null)
  int64_t seq_length = 1;                ///< encoder_seq_length
  int64_t max_position_embeddings = 1;
};

/// How activations are recomputed (model.activations_checkpoint_*); `num_layers` null = unset.
struct RecomputeSettings {
  RecomputeGranularity granularity = RecomputeGranularity::kNone;
  RecomputeMethod method = RecomputeMethod::kNone;
  std::optional<int64_t> num_layers;
};

/// A whole training layout: world = trainer.num_nodes × trainer.devices, d = world / (t·p).
struct LayoutQuery {
  int64_t num_nodes = 1, devices = 1;    ///< world = num_nodes × devices
  int64_t tensor = 1;                    ///< t, tensor_model_parallel_size
  int64_t pipeline = 1;                  ///< p, pipeline_model_parallel_size
  int64_t virtual_stages = 1;            ///< v, virtual_pipeline_model_parallel_size (1 = none)
  int64_t micro_batch = 1, global_batch = 1;
  bool sequence_parallel = false;
  ModelDims model;
  RecomputeSettings recompute;
};

/// Tensor parallelism and sequence lengths: heads % t, hidden % heads, ffn % t, s % t under
/// sequence parallelism (t > 1 only: with t = 1 it is a no-op), s <= max_position_embeddings.
std::vector<Violation> tensor_parallel_violations(const ModelDims& m, int64_t t, bool sequence_parallel);

/// Pipeline split: v > 1 needs p > 1; num_layers % (p·v) == 0 (equal model chunks).
std::vector<Violation> pipeline_violations(int64_t num_layers, int64_t p, int64_t v);

/// The interleaved schedule (v > 1) needs num_microbatches % p == 0 (Narayanan et al. 2021, §2.2;
/// docs/design/parallel_layout.md, "Pipeline schedules"). `derivation` says where the count came
/// from in the message (e.g. "global_batch_size/(micro_batch_size*data_parallel_size) = 6/(2*1)").
std::optional<Violation> interleaving_violation(int64_t num_microbatches, int64_t p, int64_t v,
                                                const std::string& derivation = "");

/// World and batch: world % (t·p) == 0; global_batch % (micro_batch·d) == 0; then interleaving.
std::vector<Violation> batch_violations(const LayoutQuery& q);

/// Recompute settings for a model chunk of `layers_per_chunk` layers: selective takes no method
/// (NeMo's `block` with 0 layers is accepted as "none") and no layer count; full takes uniform
/// with 1..layers_per_chunk layers per checkpointed group, or block with 0..layers_per_chunk
/// recomputed layers (0: nothing recomputed, as Megatron-Core's block method allows).
std::vector<Violation> recompute_violations(const RecomputeSettings& r, int64_t layers_per_chunk);

/// Every rule above, in a fixed order: batch (world first), tensor, pipeline, recompute (the
/// last only when the pipeline split is legal, since it needs the chunk size).
std::vector<Violation> layout_violations(const LayoutQuery& q);

/// Throws std::invalid_argument with every violation's text ("field: message", one per line)
/// prefixed by `context` when `violations` is not empty.
void throw_if_any(const std::vector<Violation>& violations, const std::string& context);

}  // namespace loom::rules
