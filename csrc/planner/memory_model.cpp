#include "planner/memory_model.h"

#include <algorithm>
#include <cmath>

namespace loom::planner {

double layer_activation_bytes(const ModelShape& m, int b, int t, bool sp, RecomputeGranularity r, bool fused) {
  const double s = m.seq_length, h = m.hidden_size, a = m.num_attention_heads;
  const double sbh = s * b * h;
  const double shard = sp ? t : 1;
  if (r == RecomputeGranularity::kFull) return 2 * sbh / shard;
  const double replicated = 10.0 / shard;
  const double split = (8.0 + 4.0 * m.ffn() / h) / t;
  // The fused core keeps only its fp32 log-sum-exp per query row and head (4·a·s·b/t bytes).
  const double attention = fused ? 4.0 * a / (h * t)
                           : r == RecomputeGranularity::kSelective ? 0.0 : 5.0 * a * s / (h * t);
  return sbh * (replicated + split + attention);
}

int in_flight_chunks(int p, int v, int m, int stage) {
  if (v <= 1) return std::max(1, std::min(m, p - stage));
  return std::max(1, std::min(m * v, 2 * (p - stage - 1) + (v - 1) * p + 1));
}

double layer_params_per_rank(const ModelShape& m, int t) {
  const double h = m.hidden_size, f = m.ffn();
  return (4 * h * h + 2 * h * f + 3 * h + f) / t + 6 * h;
}

double bytes_per_param(Precision p, bool dist, int d) {
  switch (p) {
    case Precision::kBf16: return dist ? 6.0 + 12.0 / d : 18.0;
    case Precision::kFp16: return dist ? 4.0 + 16.0 / d : 20.0;
    case Precision::kFp32: return dist ? 8.0 + 8.0 / d : 16.0;  // fp32 params and grads; Adam m, v sharded
  }
  return 18.0;
}

double stage_params(const ModelShape& m, const Layout& L, int stage) {
  const double h = m.hidden_size, s = m.seq_length;
  const double vocab_shard = std::ceil(double(m.vocab_size) / L.tp);
  double params = double(L.stage_layers(m.num_layers, stage)) * layer_params_per_rank(m, L.tp);
  if (stage == 0) params += vocab_shard * h + s * h;
  if (stage == L.pp - 1) params += 2 * h + (L.pp > 1 ? vocab_shard * h : 0.0);
  return params;
}

const char* MemoryTerms::largest_term() const {
  const std::pair<double, const char*> terms[] = {
      {weights_optimizer, "weights+grads+optimizer"},
      {activations, "layer activations"},
      {embedding_logits, "embedding/logits activations"},
      {transient, "recompute working set"}};
  return std::max_element(std::begin(terms), std::end(terms))->second;
}

MemoryTerms stage_memory(const ModelShape& m, const TrainingSetup& setup, const Layout& L,
                         int stage, double capacity) {
  MemoryTerms out;
  const int t = L.tp, p = L.pp, v = L.vp, b = L.micro_batch;
  const bool first = stage == 0, last = stage == p - 1;
  const double h = m.hidden_size, s = m.seq_length;
  const double vocab_shard = std::ceil(double(m.vocab_size) / t);

  // Weights, gradients and optimizer state.
  const double params = stage_params(m, L, stage);
  out.weights_optimizer = params * bytes_per_param(setup.precision, L.distributed_optimizer, L.dp);

  // Stored activations of the in-flight chunks.
  const int m_micro = setup.global_batch / (L.dp * b);
  const int chunks = in_flight_chunks(p, v, m_micro, stage);
  const int layers_per_chunk = L.stage_layers(m.num_layers, stage) / v;
  const double full_layer =
      layer_activation_bytes(m, b, t, L.sequence_parallel, RecomputeGranularity::kNone, setup.fused_attention);
  const double input = layer_activation_bytes(m, b, t, L.sequence_parallel, RecomputeGranularity::kFull);
  double per_chunk = 0;
  switch (L.recompute.granularity) {
    case RecomputeGranularity::kNone:
    case RecomputeGranularity::kSelective:
      per_chunk = layers_per_chunk *
                  layer_activation_bytes(m, b, t, L.sequence_parallel, L.recompute.granularity, setup.fused_attention);
      break;
    case RecomputeGranularity::kFull:
      if (L.recompute.method != RecomputeMethod::kBlock) {
        // A group longer than an (uneven, smaller) chunk is the whole chunk.
        const int k = std::max(1, std::min(int(L.recompute.num_layers.value_or(0)), layers_per_chunk));
        per_chunk = std::ceil(double(layers_per_chunk) / k) * input;
        out.transient = k * full_layer;
      } else {
        const int k = std::min(std::max(0, int(L.recompute.num_layers.value_or(0))), layers_per_chunk);
        per_chunk = k * input + (layers_per_chunk - k) * full_layer;
        out.transient = k > 0 ? full_layer : 0.0;
      }
      break;
  }
  out.activations = chunks * per_chunk;
  if (L.recompute.granularity == RecomputeGranularity::kSelective)
    out.transient = 5.0 * m.num_attention_heads * s * s * b / t;
  // The formulas count 2-byte activations; fp32 doubles them (the 1-byte masks are then
  // over-counted, by under 6% of the total: Loom regenerates its masks anyway).
  const double scale = element_bytes(setup.precision) / 2.0;
  out.activations *= scale;
  out.transient *= scale;

  // Outside the layers (docs/design/sp_sar.md): embedding dropout mask on the first stage for each
  // in-flight micro-batch of chunk 0; final LN input, logits-GEMM input and fp32 logits on the
  // last stage for the one micro-batch whose loss is being computed.
  const double shard = L.sequence_parallel ? t : 1;
  const double sbh = s * b * h;
  if (first) out.embedding_logits += sbh / shard * std::ceil(double(chunks) / v);
  if (last) out.embedding_logits += 4 * sbh / shard + 4.0 * s * b * vocab_shard;
  out.embedding_logits *= scale;

  out.reserve = setup.reserve_gib * 1073741824.0 + setup.fragmentation_fraction * capacity;
  return out;
}

std::vector<StageMemory> every_stage_memory(const ModelShape& m, const TrainingSetup& setup, const Layout& L,
                                            double capacity) {
  std::vector<StageMemory> out;
  const int m_micro = setup.global_batch / (L.dp * L.micro_batch);
  for (int stage = 0; stage < L.pp; ++stage)
    out.push_back({stage, L.stage_layers(m.num_layers, stage), in_flight_chunks(L.pp, L.vp, m_micro, stage),
                   stage_memory(m, setup, L, stage, capacity)});
  return out;
}

WorstStage worst_stage_memory(const ModelShape& m, const TrainingSetup& setup, const Layout& L,
                              double capacity) {
  // The middle stages hold the same layers and fewer in-flight micro-batches the later they
  // come, so stage 1 bounds them; the end stages differ (embedding, logits, uneven sizes).
  WorstStage worst{0, stage_memory(m, setup, L, 0, capacity)};
  for (int stage : {1, L.pp - 1}) {
    if (stage <= 0 || stage >= L.pp) continue;
    MemoryTerms terms = stage_memory(m, setup, L, stage, capacity);
    if (terms.total() > worst.terms.total()) worst = {stage, terms};
  }
  return worst;
}

}  // namespace loom::planner
