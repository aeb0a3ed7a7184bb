#include "rules/layout_rules.h"

#include <fmt/format.h>

#include <initializer_list>
#include <stdexcept>
#include <utility>

namespace loom::rules {

namespace {

constexpr const char* kTensor = "model.tensor_model_parallel_size";
constexpr const char* kPipeline = "model.pipeline_model_parallel_size";
constexpr const char* kVirtual = "model.virtual_pipeline_model_parallel_size";
constexpr const char* kLayers = "model.num_layers";
constexpr const char* kHeads = "model.num_attention_heads";
constexpr const char* kHidden = "model.hidden_size";
constexpr const char* kFfn = "model.ffn_hidden_size";
constexpr const char* kSeq = "model.encoder_seq_length";
constexpr const char* kMaxPositions = "model.max_position_embeddings";
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

std::vector<Violation> tensor_parallel_violations(const ModelDims& m, int64_t t, bool sequence_parallel) {
  std::vector<Violation> out;
  if (!sizes_positive(out, {{kTensor, t}, {kHeads, m.num_attention_heads}})) return out;
  if (m.num_attention_heads % t != 0)
    out.push_back(violation(kHeads, fmt::format("expected a multiple of tensor_model_parallel_size ({}), found {}", t,
                                                m.num_attention_heads), {kTensor}));
  if (m.hidden_size % m.num_attention_heads != 0)
    out.push_back(violation(kHidden, fmt::format("expected a multiple of num_attention_heads ({}), found {}",
                                                 m.num_attention_heads, m.hidden_size), {kHeads}));
  if (m.ffn_hidden_size % t != 0)
    out.push_back(violation(kFfn, fmt::format("expected a multiple of tensor_model_parallel_size ({}), found {}", t,
                                              m.ffn_hidden_size), {kTensor, kHidden}));
  // With t = 1 sequence parallelism splits nothing: Loom, like Megatron-LM, turns it off.
  if (sequence_parallel && t > 1 && m.seq_length % t != 0)
    out.push_back(violation(kSeq, fmt::format("expected a multiple of tensor_model_parallel_size ({}) with "
                                              "sequence_parallel, found {}", t, m.seq_length),
                            {kTensor, kSequenceParallel}));
  if (m.max_position_embeddings < m.seq_length)
    out.push_back(violation(kMaxPositions, fmt::format("expected at least encoder_seq_length ({}), found {}",
                                                       m.seq_length, m.max_position_embeddings), {kSeq}));
  return out;
}

std::vector<Violation> pipeline_violations(int64_t num_layers, int64_t p, int64_t v) {
  std::vector<Violation> out;
  if (!sizes_positive(out, {{kPipeline, p}, {kVirtual, v}})) return out;
  if (v > 1 && p == 1)
    out.push_back(violation(kVirtual, fmt::format("expected null or 1 when pipeline_model_parallel_size is 1 "
                                                  "(interleaving needs a pipeline), found {}", v), {kPipeline}));
  if (num_layers % (p * v) != 0)
    out.push_back(violation(
        kLayers,
        v > 1 ? fmt::format("expected a multiple of pipeline_model_parallel_size*virtual_pipeline_model_parallel_size"
                            " = {}*{} = {}, found {}", p, v, p * v, num_layers)
              : fmt::format("expected a multiple of pipeline_model_parallel_size ({}), found {}", p, num_layers),
        {kPipeline, kVirtual}));
  return out;
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
  if (!sizes_positive(out, {{kNodes, q.num_nodes}, {kDevices, q.devices}, {kTensor, q.tensor},
                            {kPipeline, q.pipeline}, {kVirtual, q.virtual_stages}, {kMicroBatch, q.micro_batch}}))
    return out;
  const int64_t world = q.num_nodes * q.devices, tp = q.tensor * q.pipeline;
  if (world % tp != 0) {
    out.push_back(violation(kDevices,
                            fmt::format("expected the world size num_nodes*devices = {}*{} = {} to be a multiple of "
                                        "tensor_model_parallel_size*pipeline_model_parallel_size = {}*{} = {}, "
                                        "found remainder {}", q.num_nodes, q.devices, world, q.tensor, q.pipeline, tp,
                                        world % tp),
                            {kNodes, kTensor, kPipeline}));
    return out;  // no data-parallel size to check the batch against
  }
  const int64_t d = world / tp, per_step = q.micro_batch * d;
  if (q.global_batch % per_step != 0) {
    out.push_back(violation(kGlobalBatch, fmt::format("expected a multiple of micro_batch_size*data_parallel_size = "
                                                      "{}*{} = {}, found {}", q.micro_batch, d, per_step,
                                                      q.global_batch),
                            {kNodes, kDevices, kTensor, kPipeline, kMicroBatch}));
    return out;
  }
  const std::string derivation = fmt::format("global_batch_size/(micro_batch_size*data_parallel_size) = {}/({}*{})",
                                             q.global_batch, q.micro_batch, d);
  if (auto v = interleaving_violation(q.global_batch / per_step, q.pipeline, q.virtual_stages, derivation))
    out.push_back(std::move(*v));
  return out;
}

std::vector<Violation> recompute_violations(const RecomputeSettings& r, int64_t layers_per_chunk) {
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
    out.push_back(violation(kRecomputeLayers, fmt::format("expected an integer in [{}, {}] (layers per pipeline "
                                                          "chunk) for method {}, found {}", lo, layers_per_chunk,
                                                          method, layers),
                            {kGranularity, kMethod, kLayers, kPipeline, kVirtual}));
  return out;
}

std::vector<Violation> layout_violations(const LayoutQuery& q) {
  std::vector<Violation> out;
  append(out, batch_violations(q));
  append(out, tensor_parallel_violations(q.model, q.tensor, q.sequence_parallel));
  auto pipeline = pipeline_violations(q.model.num_layers, q.pipeline, q.virtual_stages);
  const bool split_ok = pipeline.empty();
  append(out, std::move(pipeline));
  if (split_ok)
    append(out, recompute_violations(q.recompute, q.model.num_layers / (q.pipeline * q.virtual_stages)));
  return out;
}

void throw_if_any(const std::vector<Violation>& violations, const std::string& context) {
  if (violations.empty()) return;
  std::string text = context;
  for (const auto& v : violations) text += (text.empty() ? "" : "\n") + v.text();
  throw std::invalid_argument(text);
}

}  // namespace loom::rules
