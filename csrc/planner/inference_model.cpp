#include "planner/inference_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "planner/layout.h"
#include "planner/memory_model.h"
#include "planner/time_model.h"

namespace loom::planner {
namespace {

constexpr double kBytes = 2;  // bf16/fp16 weights, activations and KV cache

// Whether some rank of stage `stage` sends to a peer on another node (ranks: tp fastest, then
// stage, then replica). Ranks base..base+t−1 send to base+t..base+2t−1; a pair crosses a node
// boundary iff a multiple of gpus_per_node lies in (base, base + 2t − 1]. The pattern repeats
// every gpn / gcd(t·p, gpn) replicas, so only that many are checked.
bool stage_send_crosses_node(const Cluster& c, const InferenceLayout& L, int stage) {
  const long gpn = c.gpus_per_node, t = L.parallel.tp, tp_pp = long(L.parallel.tp) * L.parallel.pp;
  const long period = gpn / std::gcd(tp_pp, gpn);
  const long reps = std::min<long>(L.replicas, period);
  for (long rep = 0; rep < reps; ++rep) {
    const long base = rep * tp_pp + long(stage) * t;
    const long next_boundary = (base / gpn + 1) * gpn;  // smallest multiple of gpn above base
    if (next_boundary <= base + 2 * t - 1) return true;
  }
  return false;
}

// Point-to-point message of `bytes` from every rank of a stage to its peer in the next stage
// (all t ranks send in parallel on their own links): one latency plus bytes at the NCCL bus
// bandwidth of an intra-node pair, or of a cross-node pair (one NIC per GPU).
double p2p_seconds(const Cluster& c, double bytes, bool cross_node) {
  const double bw = cross_node ? group_bus_gbs(c, 2, c.gpus_per_node) : group_bus_gbs(c, 2, 1);
  return bytes / (bw * 1e9) + c.gpu.efficiency.collective_latency_us * 1e-6;
}

// Per-layer memory-bound kernels of a forward pass over n tokens (bytes moved, 2 B elements):
// two LayerNorms (read x, write y), two residual adds with the row-parallel bias (read 2,
// write 1), QKV bias + head split + KV-cache write (read and write 3nh/t), fused bias-GeLU
// (read and write n·ffn/t), the context permute (nh/t). Softmax is counted by the caller.
// SwiGLU reads gate and up and writes one (6·n·ffn/t); RoPE rotates Q and K (a + g heads) in place.
double layer_elementwise_bytes(const ModelShape& m, int t, double n) {
  const double h = m.hidden_size, f = m.ffn(), attn = double(m.num_attention_heads * m.head_dim());
  const double rope = m.position_embedding_type == PositionEmbedding::kRope
                          ? 4 * n * double((m.num_attention_heads + m.query_groups()) * m.head_dim()) / t : 0.0;
  const double mlp = (m.activation == Activation::kSwiglu ? 6 : 4) * n * f / t;
  return 2 * 4 * n * h + 2 * 6 * n * h + 4 * n * double(qkv_width(m)) / t + mlp + rope + 4 * n * attn / t;
}

// The four linear layers of one transformer layer on one TP rank over `tokens` rows: QKV and
// fc1 column-parallel, the projection and fc2 row-parallel.
double layer_linears_seconds(const GpuSpec& g, const ModelShape& m, double t, double tokens) {
  const double h = m.hidden_size, f = m.ffn(), attn = double(m.num_attention_heads * m.head_dim());
  return linear_seconds(g, tokens, double(qkv_width(m)) / t, h) + linear_seconds(g, tokens, h, attn / t) +
         linear_seconds(g, tokens, double(fc1_width(m)) / t, h) + linear_seconds(g, tokens, h, f / t);
}

// A stage's `layers` identical layers of per-layer cost `layer` (no pipeline send yet).
PhaseCost repeat_layer(const PhaseCost& layer, int layers) {
  PhaseCost out;
  out.gemm = layers * layer.gemm;
  out.attention = layers * layer.attention;
  out.memory_bound = layers * layer.memory_bound;
  out.tp_comm = layers * layer.tp_comm;
  return out;
}

// First-stage embedding of n tokens (vocab-parallel lookup, position add; all-reduce over TP)
// and last-stage head for the b sequences' last tokens (final LayerNorm, logits b × V/t,
// all-gather of fp32 logits, sampling reading and writing b·V fp32), added to `cost`.
void add_ends(PhaseCost& cost, const ModelShape& m, const Cluster& c, const InferenceWorkload& w,
              const InferenceLayout& L, int stage, double n) {
  const GpuSpec& g = c.gpu;
  const double h = m.hidden_size, b = L.batch, t = L.parallel.tp;
  const double v_shard = std::ceil(double(m.vocab_size) / t);
  if (stage == 0) {
    cost.memory_bound += memory_seconds(g, 4 * n * h + 6 * n * h, 2);
    cost.tp_comm += inference_collective_seconds(c, w, Collective::all_reduce, kBytes * n * h, L.parallel.tp);
  }
  if (stage == L.parallel.pp - 1) {
    cost.memory_bound += memory_seconds(g, 4 * b * h, 1);           // final LayerNorm, last tokens
    cost.gemm += linear_seconds(g, b, v_shard, h);                  // logits shard
    cost.tp_comm += inference_collective_seconds(c, w, Collective::all_gather, 4 * b * v_shard * t, L.parallel.tp);
    cost.memory_bound += memory_seconds(g, 8 * b * v_shard * t, 2); // softmax / top-p sampling
  }
}

}  // namespace

std::string InferenceLayout::describe() const {
  return fmt::format("t{} p{} b{} r{}", parallel.tp, parallel.pp, batch, replicas);
}

std::string check_inference_layout(const ModelShape& m, const Cluster& c, const InferenceLayout& L) {
  const int t = L.parallel.tp, p = L.parallel.pp;
  if (t < 1 || p < 1) return "tensor and pipeline sizes must be >= 1";
  if (L.batch < 1) return "batch must be >= 1";
  if (c.world() % (t * p) != 0) return fmt::format("t*p = {} does not divide the {} GPUs", t * p, c.world());
  if (m.num_attention_heads % t != 0)
    return fmt::format("t = {} does not divide {} attention heads", t, m.num_attention_heads);
  if (m.query_groups() % t != 0)
    return fmt::format("t = {} does not divide {} query groups (K/V heads)", t, m.query_groups());
  if (m.hidden_size % t != 0) return fmt::format("t = {} does not divide hidden size {}", t, m.hidden_size);
  if (m.ffn() % t != 0) return fmt::format("t = {} does not divide ffn size {}", t, m.ffn());
  if (m.num_layers % p != 0) return fmt::format("p = {} does not divide {} layers", p, m.num_layers);
  if (L.replicas != c.world() / (t * p)) return fmt::format("replicas must be world/(t*p) = {}", c.world() / (t * p));
  return "";
}

int inflight_batches(const InferenceLayout& L) { return L.parallel.pp; }

double kv_cache_bytes(const ModelShape& m, int tp, int layers, double sequences, double context) {
  const double kv_width = double(m.query_groups() * m.head_dim());  // K/V heads: the query groups
  return 2.0 * layers * sequences * context * (kv_width / tp) * kBytes;
}

double prefill_activation_bytes(const ModelShape& m, int t, int b, int prompt) {
  const double h = m.hidden_size, f = m.ffn(), a = m.num_attention_heads, attn = a * double(m.head_dim());
  const double n = double(b) * prompt;
  const double residual = 2 * n * h;  // layer input and norm output
  const double attention = n * double(qkv_width(m)) / t + double(b) * (a / t) * double(prompt) * prompt + n * attn / t;
  const double mlp = n * double(fc1_width(m)) / t + n * h;
  return kBytes * (residual + std::max(attention, mlp));
}

const char* InferenceMemory::largest_term() const {
  if (weights >= kv_cache && weights >= activations) return "weights";
  return kv_cache >= activations ? "kv cache" : "activations";
}

InferenceMemory inference_stage_memory(const ModelShape& m, const InferenceWorkload& w,
                                       const InferenceLayout& L, int stage) {
  InferenceMemory out;
  out.weights = kBytes * stage_params(m, L.parallel, stage);
  const int layers = m.num_layers / L.parallel.pp;
  const double sequences = double(L.batch) * inflight_batches(L);
  out.kv_cache = kv_cache_bytes(m, L.parallel.tp, layers, sequences, double(w.prompt_tokens) + w.output_tokens);
  out.activations = prefill_activation_bytes(m, L.parallel.tp, L.batch, w.prompt_tokens);
  if (stage == L.parallel.pp - 1) out.activations += 4.0 * L.batch * std::ceil(double(m.vocab_size) / L.parallel.tp);
  out.reserve = w.reserve_gib * double(1ull << 30);
  return out;
}

InferenceWorstStage inference_worst_memory(const ModelShape& m, const InferenceWorkload& w,
                                           const InferenceLayout& L) {
  InferenceWorstStage worst{0, inference_stage_memory(m, w, L, 0)};
  if (L.parallel.pp > 1) {
    const InferenceMemory last = inference_stage_memory(m, w, L, L.parallel.pp - 1);
    if (last.total() > worst.terms.total()) worst = {L.parallel.pp - 1, last};
  }
  return worst;
}

double inference_collective_seconds(const Cluster& c, const InferenceWorkload& w, Collective kind,
                                    double bytes, int t) {
  if (t <= 1) return 0;
  Cluster serving = c;
  serving.gpu.efficiency.collective_latency_us = w.collective_step_us;
  return collective_seconds(serving, kind, bytes, t, 1) + w.collective_base_us * 1e-6;
}

double linear_seconds(const GpuSpec& g, double m, double n, double k) {
  const double bytes = kBytes * (k * n + m * k + m * n);
  return std::max(gemm_seconds(g, m, n, k), memory_seconds(g, bytes, 1));
}

PhaseCost prefill_stage_cost(const ModelShape& m, const Cluster& c, const InferenceWorkload& w,
                             const InferenceLayout& L, int stage) {
  const GpuSpec& g = c.gpu;
  const double h = m.hidden_size, a = m.num_attention_heads, t = L.parallel.tp;
  const double s = w.prompt_tokens, n = double(L.batch) * s, dh = double(m.head_dim());
  PhaseCost layer;
  layer.gemm = layer_linears_seconds(g, m, t, n);
  const double heads = double(L.batch) * a / t, scores = heads * s * s;
  layer.attention = batched_gemm_seconds(g, heads, s, s, dh) + batched_gemm_seconds(g, heads, s, dh, s);
  layer.memory_bound = memory_seconds(g, layer_elementwise_bytes(m, L.parallel.tp, n) + 4 * scores, 8);
  layer.tp_comm = 2 * inference_collective_seconds(c, w, Collective::all_reduce, kBytes * n * h, L.parallel.tp);

  PhaseCost out = repeat_layer(layer, m.num_layers / L.parallel.pp);
  add_ends(out, m, c, w, L, stage, n);
  if (stage < L.parallel.pp - 1) out.pp_comm = p2p_seconds(c, kBytes * n * h, stage_send_crosses_node(c, L, stage));
  return out;
}

PhaseCost decode_stage_cost(const ModelShape& m, const Cluster& c, const InferenceWorkload& w,
                            const InferenceLayout& L, int stage, double context) {
  const GpuSpec& g = c.gpu;
  const double h = m.hidden_size, t = L.parallel.tp, b = L.batch;
  PhaseCost layer;
  layer.gemm = layer_linears_seconds(g, m, t, b);
  // One fused masked-attention kernel per layer streams this rank's K and V of every sequence;
  // its softmax stays on chip. Query in, context out: 2·b·h/t elements.
  const double attn = double(m.num_attention_heads * m.head_dim());
  layer.attention = memory_seconds(g, kv_cache_bytes(m, L.parallel.tp, 1, b, context) + kBytes * 2 * b * attn / t, 1);
  layer.memory_bound = memory_seconds(g, layer_elementwise_bytes(m, L.parallel.tp, b), 6);
  layer.tp_comm = 2 * inference_collective_seconds(c, w, Collective::all_reduce, kBytes * b * h, L.parallel.tp);

  PhaseCost out = repeat_layer(layer, m.num_layers / L.parallel.pp);
  add_ends(out, m, c, w, L, stage, b);
  if (L.parallel.pp > 1) {
    // Activations to the next stage; the last stage returns the sampled ids to the first.
    out.pp_comm = stage < L.parallel.pp - 1
                      ? p2p_seconds(c, kBytes * b * h, stage_send_crosses_node(c, L, stage))
                      : p2p_seconds(c, 4 * b, long(L.parallel.tp) * L.parallel.pp > c.gpus_per_node);
  }
  return out;
}

namespace {
void accumulate(PhaseCost& sum, const PhaseCost& x) {
  sum.gemm += x.gemm;
  sum.attention += x.attention;
  sum.memory_bound += x.memory_bound;
  sum.tp_comm += x.tp_comm;
  sum.pp_comm += x.pp_comm;
}
}  // namespace

InferenceTime inference_time(const ModelShape& m, const Cluster& c, const InferenceWorkload& w,
                             const InferenceLayout& L) {
  InferenceTime out;
  const double context = w.prompt_tokens + 0.5 * w.output_tokens;
  double max_prefill = 0, max_decode = 0;
  // Middle stages are identical apart from whether their send crosses a node, so every stage
  // is costed (p ≤ layers, cheap).
  for (int i = 0; i < L.parallel.pp; ++i) {
    const PhaseCost pre = prefill_stage_cost(m, c, w, L, i);
    const PhaseCost dec = decode_stage_cost(m, c, w, L, i, context);
    accumulate(out.prefill, pre);
    accumulate(out.decode, dec);
    max_prefill = std::max(max_prefill, pre.total());
    max_decode = std::max(max_decode, dec.total());
  }
  out.ttft = out.prefill.total();
  // With p batches in flight each batch gets one token per round of p stage slots.
  out.per_token = std::max(out.decode.total(), L.parallel.pp * max_decode);
  out.request = out.ttft + (w.output_tokens - 1) * out.per_token;
  const double busy = max_prefill + (w.output_tokens - 1) * max_decode;
  out.tokens_per_s_replica = double(L.batch) * w.output_tokens / busy;
  out.tokens_per_s_cluster = out.tokens_per_s_replica * L.replicas;
  out.tokens_per_s_per_gpu = out.tokens_per_s_cluster / c.world();
  return out;
}

}  // namespace loom::planner
