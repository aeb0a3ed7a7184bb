// Inference model: memory per GPU and latency/throughput of one serving layout (tensor size t,
// pipeline size p, batch b per replica) for autoregressive generation with a KV cache.
// docs/planner_inference.md states every formula; the primitives are the training speed model's
// (time_model.h: gemm_seconds, memory_seconds, collective_seconds, group_bus_gbs) with the same
// calibrated Efficiency, so a measured profile (--profile) changes both planners alike.
//
// A request has `prompt_tokens` input tokens and generates `output_tokens`. The prefill pass
// processes the whole prompt of the b sequences at once and yields the first output token; each
// of the remaining output_tokens − 1 tokens is one decode step over the b sequences.
// Weights and KV cache are 2 bytes per element (bf16 or fp16); nothing is quantised.
#pragma once
#include <string>

#include "planner/hardware.h"
#include "planner/layout.h"
#include "planner/model_shape.h"
#include "planner/time_model.h"

namespace loom::planner {

/// What is served: request lengths and the memory kept free per GPU.
struct InferenceWorkload {
  int prompt_tokens = 0;    ///< input tokens per request
  int output_tokens = 0;    ///< generated tokens per request (≥ 1)
  double reserve_gib = 2.0; ///< CUDA context, NCCL and cuBLAS workspaces, allocator slack
  /// Tensor-parallel all-reduces at serving sizes are latency-bound, where the training model's
  /// 10 µs per ring step (calibrated on multi-MB messages) overstates them 2–3× at t = 8.
  /// Inference collectives therefore cost collective_seconds() with `collective_step_us` per
  /// ring step plus a fixed `collective_base_us` per collective (kernel start, synchronisation).
  /// Defaults: fitted to FasterTransformer's GPT-20B batch-1 latencies at t = 1, 2, 4, 8 on
  /// A100-80GB (docs/planner_inference.md); replace them with measured small-message latencies.
  double collective_base_us = 25;
  double collective_step_us = 3;
};

/// One serving layout: replicas = world / (t·p) independent model copies, each split over t·p
/// ranks as `parallel` says. Not a training Layout with d = replicas and b = batch: replicas
/// share no collective, a batch is the sequences a replica keeps in flight per stage (not a
/// micro-batch of a global batch), and the rank order differs (here tp fastest, then pipeline
/// stage, then replica, so that neighbouring stages are tp ranks apart; training puts d before p).
struct InferenceLayout {
  /// How one replica's model is split: t (parallel.tp) and p (parallel.pp, even stages). The
  /// one layout type (rules/layout.h); its training fields (batch, recompute, optimizer, d) are
  /// not read and stay at their defaults.
  Layout parallel;
  int batch = 1;     ///< sequences processed together by one replica (per pipeline micro-batch)
  int replicas = 1;  ///< world / (t·p)
  /// "t8 p1 b4 r2".
  std::string describe() const;
};

/// Why a layout is invalid, or "" when valid: t | heads, t | query groups, t | ffn, t | hidden, p | layers,
/// t·p | world, batch ≥ 1.
std::string check_inference_layout(const ModelShape& m, const Cluster& c, const InferenceLayout& layout);

/// Batches a replica keeps in flight: p (one per stage, so that no stage idles during decode).
/// Each stage therefore holds the KV cache of p·b sequences.
int inflight_batches(const InferenceLayout& layout);

/// KV-cache bytes of `layers` layers on one GPU: 2 (K and V) · layers · sequences · context ·
/// (g·d/t) · 2 B, g the query groups (K/V heads; g·d = h for multi-head attention), d the head
/// dimension: grouped-query attention caches a/g times less (model/kv_cache.h).
double kv_cache_bytes(const ModelShape& m, int tp, int layers, double sequences, double context_tokens);

/// Largest live activation set of one prefill layer on one GPU for b sequences of `prompt`
/// tokens (n = b·prompt, 2 B per element, unfused attention as in FasterTransformer's context
/// phase): the residual stream and norm output (2nh) plus the larger of the attention part
/// (QKV n·(a+2g)d/t, scores b·(a/t)·prompt², context n·a·d/t) and the MLP part (fc1 output
/// n·ffn/t, 2·n·ffn/t for SwiGLU's gate and up; fc2 output nh).
double prefill_activation_bytes(const ModelShape& m, int tp, int batch, int prompt_tokens);

/// Memory of one GPU of one stage, bytes by term.
struct InferenceMemory {
  double weights = 0;      ///< 2 B per parameter of the stage (stage_params of memory_model.h)
  double kv_cache = 0;     ///< K and V of the stage's layers for all in-flight sequences at full context
  double activations = 0;  ///< prefill working set of one layer, plus last-token fp32 logits b·V/t on the last stage
  double reserve = 0;      ///< workload.reserve_gib
  double total() const { return weights + kv_cache + activations + reserve; }
  /// "weights", "kv cache" or "activations": the largest term besides the reserve.
  const char* largest_term() const;
};

/// Memory of stage `stage` (0-based). Layout must be valid.
InferenceMemory inference_stage_memory(const ModelShape& m, const InferenceWorkload& w,
                                       const InferenceLayout& layout, int stage);

/// The stage needing the most memory (first or last; middle stages hold less) and its terms.
struct InferenceWorstStage {
  int stage = 0;
  InferenceMemory terms;
};
InferenceWorstStage inference_worst_memory(const ModelShape& m, const InferenceWorkload& w,
                                           const InferenceLayout& layout);

/// Seconds of one pass of one pipeline stage for one micro-batch, by term.
struct PhaseCost {
  double gemm = 0;          ///< linear layers (and logits): max(compute, weight read)
  double attention = 0;     ///< prefill score/context GEMMs; decode KV-cache read
  double memory_bound = 0;  ///< LayerNorm, residual adds, bias-GeLU, softmax, embedding, sampling
  double tp_comm = 0;       ///< tensor-parallel all-reduces / logits all-gather
  double pp_comm = 0;       ///< send of the activation to the next stage
  double total() const { return gemm + attention + memory_bound + tp_comm + pp_comm; }
};

/// Seconds of a linear layer y[M,N] = x[M,K]·W[K,N] (weights 2 B): the larger of the GEMM model
/// (gemm_seconds) and reading W, x and writing y at the achieved HBM bandwidth (memory_seconds);
/// at decode batch sizes the weight read binds.
double linear_seconds(const GpuSpec& gpu, double m, double n, double k);

/// Prefill pass of stage `stage` for b sequences of the whole prompt: per layer the four linear
/// layers with M = b·prompt, attention score and context batched GEMMs over b·a/t heads, the
/// memory-bound kernels, two all-reduces of [b·prompt, h]; embedding on the first stage, final
/// LayerNorm, last-token logits (b×V/t), their all-gather and sampling on the last; the send of
/// [b·prompt, h] to the next stage.
PhaseCost prefill_stage_cost(const ModelShape& m, const Cluster& c, const InferenceWorkload& w,
                             const InferenceLayout& layout, int stage);

/// One decode step of stage `stage` for b sequences at `context` tokens of KV cache: linear
/// layers with M = b, the KV-cache read 2·b·context·(g·d/t)·2 B per layer, memory-bound kernels,
/// two all-reduces of [b, h] per layer; embedding / logits / sampling on the end stages; the
/// send of [b, h].
PhaseCost decode_stage_cost(const ModelShape& m, const Cluster& c, const InferenceWorkload& w,
                            const InferenceLayout& layout, int stage, double context);

/// Seconds of a tensor-parallel collective of `bytes` (full tensor) over `t` adjacent ranks at
/// serving sizes: collective_seconds() with w.collective_step_us per ring step, plus
/// w.collective_base_us (0 when t = 1).
double inference_collective_seconds(const Cluster& c, const InferenceWorkload& w, Collective kind,
                                    double bytes, int t);

/// Predicted serving figures of one layout.
struct InferenceTime {
  PhaseCost prefill;            ///< summed over stages (sends included)
  PhaseCost decode;             ///< one decode step summed over stages
  double ttft = 0;              ///< time to first token: Σ prefill stage times, s
  double per_token = 0;         ///< interval between generated tokens: p · max stage decode time, s
  double request = 0;           ///< ttft + (output_tokens − 1) · per_token, s
  double tokens_per_s_replica = 0;  ///< generated tokens/s of one replica with p batches in flight
  double tokens_per_s_cluster = 0;  ///< × replicas
  double tokens_per_s_per_gpu = 0;  ///< ÷ world
};

/// Time of a valid layout. Per-token latency uses the average decode context
/// prompt + output/2; throughput per replica = b·output / (max_i P_i + (output − 1)·max_i D_i)
/// for stage prefill times P_i and decode times D_i (each stage serves p batches in turn).
InferenceTime inference_time(const ModelShape& m, const Cluster& c, const InferenceWorkload& w,
                             const InferenceLayout& layout);

}  // namespace loom::planner
