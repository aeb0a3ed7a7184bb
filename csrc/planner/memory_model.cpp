#include "planner/memory_model.h"

#include "planner/memory_breakdown.h"

#include <algorithm>
#include <cmath>

namespace loom::planner {

double layer_activation_bytes(const ModelShape& m, int b, int t, bool sp, RecomputeGranularity r, bool fused) {
  const double s = m.seq_length, h = m.hidden_size, a = m.num_attention_heads;
  const double sbh = s * b * h;
  const double shard = sp ? t : 1;
  if (r == RecomputeGranularity::kFull) return 2 * sbh / shard;
  const double replicated = 10.0 / shard;
  // Q, K, V and the projection input at their widths ((a + 2g)·d and a·d; 6 + 2 for GPT), fc1's
  // output (gate and up for SwiGLU) and the activation's output (fc2's input).
  const double split = 2.0 * (double(qkv_width(m)) + double(m.num_attention_heads * m.head_dim()) +
                              double(fc1_width(m)) + double(m.ffn())) / h / t;
  // The fused core keeps only its fp32 log-sum-exp per query row and head (4·a·s·b/t bytes).
  const double attention = fused ? 4.0 * a / (h * t)
                           : r == RecomputeGranularity::kSelective ? 0.0 : 5.0 * a * s / (h * t);
  return sbh * (replicated + split + attention);
}

int in_flight_chunks(int p, int v, int m, int stage) {
  if (v <= 1) return std::max(1, std::min(m, p - stage));
  // With as many micro-batches as stages every forward runs before the first backward
  // (train/pipeline_schedule.cpp, schedule_order; Megatron's schedule does the same).
  if (m == p) return m * v;
  return std::max(1, std::min(m * v, 2 * (p - stage - 1) + (v - 1) * p + 1));
}

double layer_params_per_rank(const ModelShape& m, int t) { return layer_parameters(m).per_rank(t); }

double bytes_per_param(Precision p, bool dist, int d) { return model_states(1.0, p, dist, d).total(); }

double position_table_params(const ModelShape& m) {
  return m.position_embedding_type == PositionEmbedding::kLearnedAbsolute
             ? double(m.max_position_embeddings) * double(m.hidden_size) : 0.0;
}

double output_layer_params(const ModelShape& m, const Layout& L) {
  if (m.share_embeddings_and_output_weights && L.pp == 1) return 0.0;  // the embedding itself
  return double(m.padded_vocab_size(L.tp)) / L.tp * double(m.hidden_size);
}

double stage_params(const ModelShape& m, const Layout& L, int stage) {
  const double h = m.hidden_size;
  const double vocab_shard = double(m.padded_vocab_size(L.tp)) / L.tp;
  double params = double(L.stage_layers(m.num_layers, stage)) * layer_params_per_rank(m, L.tp);
  if (stage == 0) params += vocab_shard * h + position_table_params(m);
  if (stage == L.pp - 1) params += norm_parameters(m) + output_layer_params(m, L);
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
  // What Loom allocates at the step's peak (planner/memory_breakdown.h), grouped into the
  // report's terms, plus the reserve.
  const StageBreakdown b = stage_breakdown(m, setup, L, stage);
  MemoryTerms out;
  out.weights_optimizer = b.states.total();
  out.activations = b.at_peak.activations;
  out.embedding_logits = b.at_peak.logits;
  out.transient = b.at_peak.recompute + b.at_peak.grads + b.at_peak.communication + b.at_peak.workspace;
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
