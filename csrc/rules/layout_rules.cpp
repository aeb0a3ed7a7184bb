#include "rules/layout_rules.h"

#include <fmt/format.h>

#include <algorithm>
#include <initializer_list>
#include <stdexcept>
#include <utility>

namespace loom::rules {

namespace {

constexpr const char* kTensor = "model.tensor_model_parallel_size";
constexpr const char* kPipeline = "model.pipeline_model_parallel_size";
constexpr const char* kVirtual = "model.virtual_pipeline_model_parallel_size";
constexpr const char* kLayers = "model.num_layers";
constexpr const char* kFirstStage = "model.num_layers_in_first_pipeline_stage";
constexpr const char* kLastStage = "model.num_layers_in_last_pipeline_stage";
constexpr const char* kHeads = "model.num_attention_heads";
constexpr const char* kHidden = "model.hidden_size";
constexpr const char* kFfn = "model.ffn_hidden_size";
constexpr const char* kSeq = "model.encoder_seq_length";
constexpr const char* kMaxPositions = "model.max_position_embeddings";
constexpr const char* kQueryGroups = "model.num_query_groups";
constexpr const char* kRotaryBase = "model.rotary_base";
constexpr const char* kRotaryPercentage = "model.rotary_percentage";
constexpr const char* kPositionType = "model.position_embedding_type";
constexpr const char* kKvChannels = "model.kv_channels";
constexpr const char* kRopeScaling = "model.rope_scaling";
constexpr const char* kSequenceParallel = "model.sequence_parallel";
constexpr const char* kMicroBatch = "model.micro_batch_size";
constexpr const char* kGlobalBatch = "model.global_batch_size";
constexpr const char* kNodes = "trainer.num_nodes";
constexpr const char* kDevices = "trainer.devices";
constexpr const char* kGranularity = "model.activations_checkpoint_granularity";
constexpr const char* kMethod = "model.activations_checkpoint_method";
constexpr const char* kRecomputeLayers = "model.activations_checkpoint_num_layers";

Violation violation(const char* field, std::string message, std::vector<std::string> reads) {
  reads.insert(reads.begin(), field);
  return {field, std::move(message), std::move(reads)};
}

/// Appends `from`, leaving out violations already listed (a bad size is seen by several groups).
void append(std::vector<Violation>& to, std::vector<Violation> from) {
  for (auto& v : from) {
    bool seen = false;
    for (const auto& w : to) seen = seen || (w.field == v.field && w.message == v.message);
    if (!seen) to.push_back(std::move(v));
  }
}

/// Sizes the rules divide by must be >= 1; reports those that are not (the recipe checker has
/// reported them already and skips these by their field).
bool sizes_positive(std::vector<Violation>& out, std::initializer_list<std::pair<const char*, int64_t>> sizes) {
  bool ok = true;
  for (const auto& [field, value] : sizes) {
    if (value >= 1) continue;
    out.push_back(violation(field, fmt::format("expected an integer >= 1, found {}", value), {}));
    ok = false;
  }
  return ok;
}

}  // namespace

std::vector<Violation> tensor_parallel_violations(const ModelShape& m, int64_t t, bool sequence_parallel) {
  std::vector<Violation> out;
  if (!sizes_positive(out, {{kTensor, t}, {kHeads, m.num_attention_heads}})) return out;
  if (m.num_attention_heads % t != 0)
    out.push_back(violation(kHeads, fmt::format("expected a multiple of tensor_model_parallel_size ({}), found {}", t,
                                                m.num_attention_heads), {kTensor}));
  if (m.kv_channels == 0 && m.hidden_size % m.num_attention_heads != 0)
    out.push_back(violation(kHidden, fmt::format("expected a multiple of num_attention_heads ({}), found {}",
                                                 m.num_attention_heads, m.hidden_size), {kHeads, kKvChannels}));
  if (m.ffn() % t != 0)
    out.push_back(violation(kFfn, fmt::format("expected a multiple of tensor_model_parallel_size ({}), found {}", t,
                                              m.ffn()), {kTensor, kHidden}));
  // With t = 1 sequence parallelism splits nothing: Loom, like Megatron-LM, turns it off.
  if (sequence_parallel && t > 1 && m.seq_length % t != 0)
    out.push_back(violation(kSeq, fmt::format("expected a multiple of tensor_model_parallel_size ({}) with "
                                              "sequence_parallel, found {}", t, m.seq_length),
                            {kTensor, kSequenceParallel}));
  if (m.max_position_embeddings < m.seq_length)
    out.push_back(violation(kMaxPositions, fmt::format("expected at least encoder_seq_length ({}), found {}",
                                                       m.seq_length, m.max_position_embeddings), {kSeq}));
  append(out, architecture_violations(m, t));
  return out;
}

std::vector<Violation> architecture_violations(const ModelShape& m, int64_t t) {
  std::vector<Violation> out;
  if (m.num_query_groups < 0) {
    out.push_back(violation(kQueryGroups, fmt::format("expected null or an integer >= 1, found {}", m.num_query_groups),
                            {}));
  } else if (m.num_query_groups > 0 && m.num_attention_heads >= 1 && t >= 1) {
    const int64_t g = m.num_query_groups;
    if (m.num_attention_heads % g != 0)
      out.push_back(violation(kQueryGroups, fmt::format("expected a divisor of num_attention_heads ({}), found {}",
                                                        m.num_attention_heads, g), {kHeads}));
    else if (g % t != 0)
      out.push_back(violation(kQueryGroups, fmt::format("expected a multiple of tensor_model_parallel_size ({}): each "
                                                        "tensor-parallel rank holds whole key/value heads, found {}", t, g),
                              {kTensor}));
  }
  if (m.kv_channels < 0)
    out.push_back(violation(kKvChannels, fmt::format("expected null or an integer >= 1, found {}", m.kv_channels), {}));
  if (!(m.rotary_percentage > 0.0 && m.rotary_percentage <= 1.0))
    out.push_back(violation(kRotaryPercentage, fmt::format("expected a fraction in (0, 1], found {}", m.rotary_percentage),
                            {}));
  const bool head_known = m.num_attention_heads >= 1 && (m.kv_channels > 0 || m.hidden_size % m.num_attention_heads == 0);
  if (m.position_embedding_type == PositionEmbedding::kRope) {
    if (!(m.rotary_base > 0.0))
      out.push_back(violation(kRotaryBase, fmt::format("expected > 0, found {}", m.rotary_base), {}));
    // Rotate-half pairs dimension i with i + r/2 of the r rotated ones.
    if (head_known && m.rotary_percentage > 0.0 && m.rotary_percentage <= 1.0 &&
        (m.rotary_dim() < 2 || m.rotary_dim() % 2 != 0))
      out.push_back(violation(kPositionType, fmt::format("rope needs an even number >= 2 of rotated dimensions per head "
                                                         "(int(head dimension {} (kv_channels, or hidden / heads) * rotary_percentage {})), found {}",
                                                         m.head_dim(), m.rotary_percentage, m.rotary_dim()),
                              {kHidden, kHeads, kKvChannels, kRotaryPercentage}));
  }
  const RopeScaling& r = m.rope_scaling;
  if (r.enabled) {
    if (m.position_embedding_type != PositionEmbedding::kRope)
      out.push_back(violation(kRopeScaling, "true needs position_embedding_type rope", {kPositionType}));
    if (!(r.factor > 0.0))
      out.push_back(violation("model.rope_scaling_factor", fmt::format("expected > 0, found {}", r.factor), {}));
    if (!(r.low_freq_factor > 0.0 && r.high_freq_factor > r.low_freq_factor))
      out.push_back(violation("model.high_freq_factor", fmt::format("expected 0 < low_freq_factor < high_freq_factor, "
                                                                    "found {} and {}", r.low_freq_factor,
                                                                    r.high_freq_factor),
                              {"model.low_freq_factor"}));
    if (r.old_context_len < 1)
      out.push_back(violation("model.old_context_len", fmt::format("expected an integer >= 1, found {}",
                                                                   r.old_context_len), {}));
  }
  return out;
}

namespace {

/// Megatron-Core's uneven split (transformer_config.py __post_init__, "Uneven PP"): the end
/// stages' set sizes, then the even share of the stages left.
void uneven_violations(const PipelineSplit& s, std::vector<Violation>& out) {
  const int64_t p = s.pipeline, v = s.virtual_stages;
  struct End { const char* field; const char* name; std::optional<int64_t> layers; };
  const End ends[] = {{kFirstStage, "num_layers_in_first_pipeline_stage", s.first_stage_layers},
                      {kLastStage, "num_layers_in_last_pipeline_stage", s.last_stage_layers}};
  bool sizes_ok = true;
  for (const auto& e : ends) {
    if (!e.layers) continue;
    if (p == 1) {
      out.push_back(violation(e.field, fmt::format("expected null when pipeline_model_parallel_size is 1 (one "
                                                   "stage holds all num_layers), found {}", *e.layers), {kPipeline}));
      sizes_ok = false;
    } else if (*e.layers < 1) {
      out.push_back(violation(e.field, fmt::format("expected null or an integer >= 1, found {}", *e.layers), {}));
      sizes_ok = false;
    } else if (*e.layers % v != 0) {
      out.push_back(violation(e.field, fmt::format("expected a multiple of virtual_pipeline_model_parallel_size "
                                                   "({}: the stage's model chunks are equal), found {}", v,
                                                   *e.layers), {kVirtual}));
      sizes_ok = false;
    }
  }
  if (!sizes_ok) return;
  // The stages without a set size ("the other stages") share what the set ones leave.
  int64_t left = s.num_layers, others = p;
  std::string names, values;
  for (const auto& e : ends) {
    if (!e.layers) continue;
    left -= *e.layers;
    --others;
    names += (names.empty() ? "" : " + ") + std::string(e.name);
    values += (values.empty() ? "" : " + ") + std::to_string(*e.layers);
  }
  const std::string set_sum =
      names.find('+') == std::string::npos ? fmt::format("{} = {}", names, values)
                                           : fmt::format("{} = {} = {}", names, values, s.num_layers - left);
  const std::vector<std::string> reads = {kFirstStage, kLastStage, kPipeline, kVirtual};
  if (others == 0) {
    if (left != 0)
      out.push_back(violation(kLayers, fmt::format("expected {} (pipeline_model_parallel_size {} leaves no other "
                                                   "stage), found {}", set_sum, p, s.num_layers), reads));
    return;
  }
  if (left < 1) {
    out.push_back(violation(kLayers, fmt::format("expected more than {} (the {} other pipeline stage{} must hold "
                                                 "layers too), found {}", set_sum, others, others == 1 ? "" : "s",
                                                 s.num_layers), reads));
    return;
  }
  if (left % others != 0) {
    out.push_back(violation(kLayers, fmt::format("expected the layers left by {}, {} - {} = {}, to be a multiple of "
                                                 "the other pipeline stages ({}), found remainder {}", set_sum,
                                                 s.num_layers, s.num_layers - left, left, others, left % others),
                            reads));
    return;
  }
  if ((left / others) % v != 0)
    out.push_back(violation(kLayers, fmt::format("expected each other pipeline stage's layers, ({} - {})/{} = {}, "
                                                 "to be a multiple of virtual_pipeline_model_parallel_size ({}), "
                                                 "found remainder {}", s.num_layers, s.num_layers - left, others,
                                                 left / others, v, (left / others) % v),
                            reads));
}

}  // namespace

std::vector<Violation> pipeline_violations(int64_t num_layers, int64_t p, int64_t v) {
  PipelineSplit split;
  split.num_layers = num_layers;
  split.pipeline = p;
  split.virtual_stages = v;
  return pipeline_violations(split);
}

std::vector<Violation> pipeline_violations(const PipelineSplit& split) {
  std::vector<Violation> out;
  const int64_t num_layers = split.num_layers, p = split.pipeline, v = split.virtual_stages;
  if (!sizes_positive(out, {{kPipeline, p}, {kVirtual, v}})) return out;
  if (v > 1 && p == 1)
    out.push_back(violation(kVirtual, fmt::format("expected null or 1 when pipeline_model_parallel_size is 1 "
                                                  "(interleaving needs a pipeline), found {}", v), {kPipeline}));
  if (split.uneven()) {
    uneven_violations(split, out);
    return out;
  }
  if (num_layers % (p * v) != 0)
    out.push_back(violation(
        kLayers,
        v > 1 ? fmt::format("expected a multiple of pipeline_model_parallel_size*virtual_pipeline_model_parallel_size"
                            " = {}*{} = {}, found {}", p, v, p * v, num_layers)
              : fmt::format("expected a multiple of pipeline_model_parallel_size ({}), found {}", p, num_layers),
        {kPipeline, kVirtual}));
  return out;
}

int64_t stage_layers(const PipelineSplit& split, int64_t stage) {
  if (stage == 0 && split.first_stage_layers) return *split.first_stage_layers;
  if (stage == split.pipeline - 1 && split.last_stage_layers) return *split.last_stage_layers;
  int64_t left = split.num_layers, others = split.pipeline;
  for (const auto& set : {split.first_stage_layers, split.last_stage_layers})
    if (set) left -= *set, --others;
  return others > 0 ? left / others : 0;
}

std::vector<int64_t> stage_layer_counts(const PipelineSplit& split) {
  throw_if_any(pipeline_violations(split), "pipeline split:");
  std::vector<int64_t> counts;
  for (int64_t stage = 0; stage < split.pipeline; ++stage) counts.push_back(stage_layers(split, stage));
  return counts;
}

std::vector<LayerRange> virtual_stage_layer_ranges(const PipelineSplit& split) {
  const auto counts = stage_layer_counts(split);
  std::vector<LayerRange> out;
  int64_t next = 0;
  for (int64_t k = 0; k < split.virtual_stages; ++k)
    for (const int64_t n : counts) {
      out.push_back({next, next + n / split.virtual_stages});
      next = out.back().last;
    }
  return out;
}

int64_t largest_chunk_layers(const PipelineSplit& split) {
  int64_t most = 0;
  for (const int64_t n : stage_layer_counts(split)) most = std::max(most, n / split.virtual_stages);
  return most;
}

std::optional<Violation> interleaving_violation(int64_t num_microbatches, int64_t p, int64_t v,
                                                const std::string& derivation) {
  if (v <= 1 || p < 1 || num_microbatches % p == 0) return std::nullopt;
  return violation(kVirtual, fmt::format("the interleaved schedule expects num_microbatches{} to be a multiple of "
                                         "pipeline_model_parallel_size ({}), found {}",
                                         derivation.empty() ? "" : " (" + derivation + ")", p, num_microbatches),
                   {kPipeline, kMicroBatch, kGlobalBatch, kNodes, kDevices, kTensor});
}

std::vector<Violation> batch_violations(const LayoutQuery& q) {
  std::vector<Violation> out;
  const Layout& l = q.layout;
  if (!sizes_positive(out, {{kNodes, q.num_nodes}, {kDevices, q.devices}, {kTensor, l.tp},
                            {kPipeline, l.pp}, {kVirtual, l.vp}, {kMicroBatch, l.micro_batch}}))
    return out;
  const int64_t world = q.num_nodes * q.devices, tp = int64_t(l.tp) * l.pp;
  if (world % tp != 0) {
    out.push_back(violation(kDevices,
                            fmt::format("expected the world size num_nodes*devices = {}*{} = {} to be a multiple of "
                                        "tensor_model_parallel_size*pipeline_model_parallel_size = {}*{} = {}, "
                                        "found remainder {}", q.num_nodes, q.devices, world, l.tp, l.pp, tp,
                                        world % tp),
                            {kNodes, kTensor, kPipeline}));
    return out;  // no data-parallel size to check the batch against
  }
  const int64_t d = world / tp, per_step = l.micro_batch * d;
  if (l.global_batch % per_step != 0) {
    out.push_back(violation(kGlobalBatch, fmt::format("expected a multiple of micro_batch_size*data_parallel_size = "
                                                      "{}*{} = {}, found {}", l.micro_batch, d, per_step,
                                                      l.global_batch),
                            {kNodes, kDevices, kTensor, kPipeline, kMicroBatch}));
    return out;
  }
  const std::string derivation = fmt::format("global_batch_size/(micro_batch_size*data_parallel_size) = {}/({}*{})",
                                             l.global_batch, l.micro_batch, d);
  if (auto v = interleaving_violation(l.global_batch / per_step, l.pp, l.vp, derivation))
    out.push_back(std::move(*v));
  return out;
}

std::vector<Violation> recompute_violations(const RecomputeSettings& r, int64_t layers_per_chunk, bool uneven) {
  std::vector<Violation> out;
  const std::string method = recipe_name(r.method);
  const std::string layers = r.num_layers ? std::to_string(*r.num_layers) : "null";
  switch (r.granularity) {
    case RecomputeGranularity::kNone:
      return out;  // a method without granularity does nothing (the recipe check warns)
    case RecomputeGranularity::kSelective: {
      // NeMo's shipped recipes spell "no method" as block with 0 layers.
      const bool nemo_none = r.method == RecomputeMethod::kBlock && r.num_layers.value_or(0) == 0;
      if (r.method != RecomputeMethod::kNone && !nemo_none)
        out.push_back(violation(kMethod, "expected null with activations_checkpoint_granularity selective (only full "
                                         "recomputation takes a method), found " + method, {kGranularity}));
      else if (r.method == RecomputeMethod::kNone && r.num_layers.value_or(0) != 0)
        out.push_back(violation(kRecomputeLayers, "expected null with activations_checkpoint_granularity selective, "
                                                  "found " + layers, {kGranularity, kMethod}));
      return out;
    }
    case RecomputeGranularity::kFull:
      break;
  }
  if (r.method == RecomputeMethod::kNone) {
    out.push_back(violation(kMethod, "expected uniform or block with activations_checkpoint_granularity full, "
                                     "found null", {kGranularity}));
    return out;
  }
  const int64_t lo = r.method == RecomputeMethod::kUniform ? 1 : 0;
  if (!r.num_layers || *r.num_layers < lo || *r.num_layers > layers_per_chunk)
    out.push_back(violation(kRecomputeLayers, fmt::format("expected an integer in [{}, {}] ({}) for method {}, "
                                                          "found {}", lo, layers_per_chunk,
                                                          uneven ? "layers of the largest pipeline chunk"
                                                                 : "layers per pipeline chunk",
                                                          method, layers),
                            {kGranularity, kMethod, kLayers, kPipeline, kVirtual, kFirstStage, kLastStage}));
  return out;
}

std::vector<Violation> layout_violations(const LayoutQuery& q) {
  std::vector<Violation> out;
  append(out, batch_violations(q));
  append(out, tensor_parallel_violations(q.model, q.layout.tp, q.layout.sequence_parallel));
  auto pipeline = pipeline_violations(q.split());
  const bool split_ok = pipeline.empty();
  append(out, std::move(pipeline));
  if (split_ok) append(out, recompute_violations(q.layout.recompute, largest_chunk_layers(q.split()), q.split().uneven()));
  return out;
}

std::vector<Violation> fused_attention_violations(bool use_flash_attention, double attention_dropout,
                                                  RecomputeGranularity granularity) {
  std::vector<Violation> out;
  if (!use_flash_attention) return out;
  constexpr const char* kFlash = "model.use_flash_attention";
  if (attention_dropout != 0.0)
    out.push_back(violation("model.attention_dropout",
                            fmt::format("expected 0.0 with use_flash_attention true (the fused kernel draws its own "
                                        "dropout mask, not Loom's position-keyed one, so layouts would no longer "
                                        "reproduce each other), found {}", attention_dropout),
                            {kFlash}));
  if (granularity == RecomputeGranularity::kSelective)
    out.push_back(violation(kGranularity, "expected null or full with use_flash_attention true (the fused attention "
                                          "core stores no s x s activations, so selective recomputation has "
                                          "nothing to save), found selective", {kFlash}));
  return out;
}

void throw_if_any(const std::vector<Violation>& violations, const std::string& context) {
  if (violations.empty()) return;
  std::string text = context;
  for (const auto& v : violations) text += (text.empty() ? "" : "\n") + v.text();
  throw std::invalid_argument(text);
}

}  // namespace loom::rules
