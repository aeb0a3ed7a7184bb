#include "planner/time_model.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "planner/memory_model.h"

namespace loom::planner {
namespace {

// Exposed part of a collective of `comm` seconds overlapped with `compute` seconds of GEMM.
double exposed(const Efficiency& e, double comm, double compute) {
  return comm - e.comm_overlap_fraction * std::min(comm, compute);
}

double shape_factor(const Efficiency& e, double x) { return x / (x + e.gemm_half_dim); }

// Stage components before the pipeline combines them. `forward`: the part of total() that is
// forward passes (what an overlapped parameter gather can hide behind; the rest is backward).
struct StageTime {
  double gemm = 0, attention = 0, memory = 0, tp_comm = 0, pp_comm = 0, recompute = 0, forward = 0;
  double total() const { return gemm + attention + memory + tp_comm + pp_comm + recompute; }
  void add(const PassCost& c, double times) {
    gemm += times * c.gemm;
    attention += times * c.attention;
    memory += times * c.memory;
    tp_comm += times * c.comm;
  }
  void add_forward(const PassCost& c, double times) {
    add(c, times);
    forward += times * c.total();
  }
};

}  // namespace

double gemm_output_seconds(const GpuSpec& g, double count, double m, double n, double eb) {
  return count * eb * m * n / (g.memory_bandwidth_gbs * 1e9 * g.efficiency.memory_fraction);
}

double batched_gemm_seconds(const GpuSpec& g, double count, double m, double n, double k, double eb) {
  const Efficiency& e = g.efficiency;
  const double eff = e.gemm_max_fraction * shape_factor(e, m) * shape_factor(e, n) * shape_factor(e, k);
  return count * 2 * m * n * k / (g.peak_tflops * 1e12 * eff) + gemm_output_seconds(g, count, m, n, eb) +
         e.kernel_launch_us * 1e-6;
}

double gemm_seconds(const GpuSpec& g, double m, double n, double k, double eb) {
  return batched_gemm_seconds(g, 1, m, n, k, eb);
}

double gemm_tflops(const GpuSpec& g, double m, double n, double k, double eb) {
  return 2 * m * n * k / gemm_seconds(g, m, n, k, eb) / 1e12;
}

double fused_attention_fwd_flops(double count, double s, double dh) {
  return 4 * count * s * s * dh * (s + 128) / (2 * s);
}

double memory_seconds(const GpuSpec& g, double bytes, int kernels) {
  return bytes / (g.memory_bandwidth_gbs * 1e9 * g.efficiency.memory_fraction) +
         kernels * g.efficiency.kernel_launch_us * 1e-6;
}

double group_bus_gbs(const Cluster& c, int size, int stride) {
  if (size <= 1) return std::numeric_limits<double>::infinity();
  const GpuSpec& g = c.gpu;
  const int gpn = c.gpus_per_node;
  const long span = long(stride) * size;
  if (span <= gpn && gpn % span == 0) return g.intra_node_gbs * g.efficiency.intra_node_comm_fraction;
  const int per_node = stride < gpn ? std::max(1, std::min(size, gpn / stride)) : 1;
  return std::min(g.intra_node_gbs, per_node * g.inter_node_gbs) * g.efficiency.inter_node_comm_fraction;
}

double collective_seconds(const Cluster& c, Collective kind, double bytes, int n, int stride) {
  if (n <= 1) return 0;
  const double bw = group_bus_gbs(c, n, stride) * 1e9;
  const double alpha = c.gpu.efficiency.collective_latency_us * 1e-6;
  const double steps = kind == Collective::all_reduce ? 2.0 * (n - 1) : double(n - 1);
  return steps / n * bytes / bw + steps * alpha;
}

LayerCost layer_cost(const ModelShape& md, const Cluster& c, int t, bool sp, int b, double eb, bool fused,
                     bool overlap_tp) {
  const GpuSpec& g = c.gpu;
  const double s = md.seq_length, h = md.hidden_size, f = md.ffn(), a = md.num_attention_heads;
  const double n = double(b) * s, dh = double(md.head_dim());
  const double qkv = double(qkv_width(md)), attn = a * dh, fc1 = double(fc1_width(md));
  const bool swiglu = md.activation == Activation::kSwiglu, rope = md.position_embedding_type == PositionEmbedding::kRope;
  LayerCost out;

  // Dense GEMMs: {M, N, K} of QKV (column; (a + 2g)·d wide), projection (row), fc1 (column; gate
  // and up for SwiGLU), fc2 (row).
  const double gemms[4][3] = {{n, qkv / t, h}, {n, h, attn / t}, {n, fc1 / t, h}, {n, h, f / t}};
  double dgrad[4], wgrad[4];
  for (int i = 0; i < 4; ++i) {
    const double M = gemms[i][0], N = gemms[i][1], K = gemms[i][2];
    out.fwd.gemm += gemm_seconds(g, M, N, K, eb);
    dgrad[i] = gemm_seconds(g, M, K, N, eb);  // dX[M,K] = dY[M,N]·Wᵀ
    wgrad[i] = gemm_seconds(g, K, N, M, eb);  // dW[K,N] = Xᵀ·dY
    out.bwd.gemm += dgrad[i] + wgrad[i];
  }

  // Attention scores QKᵀ [s,s] over d_h and context P·V [s,d_h] over s, per head and sample.
  const double batches = double(b) * a / t;
  if (fused) {
    // One fused kernel each way (FlashAttention's tiling): causal tiles only, i.e. half the s²
    // products plus the 128-wide diagonal tiles computed whole; backward recomputes the scores
    // and runs four products, 2.5× the forward FLOPs (Dao 2023, §3.1). Achieved fraction of peak
    // from the published kernel figures, under-filled for short sequences like a GEMM side.
    const Efficiency& e = g.efficiency;
    const double fwd_flops = fused_attention_fwd_flops(batches, s, dh);
    const double fill = shape_factor(e, s);
    out.fwd.attention = fwd_flops / (g.peak_tflops * 1e12 * e.fused_attention_fwd_fraction * fill) +
                        e.kernel_launch_us * 1e-6;
    out.bwd.attention = 2.5 * fwd_flops / (g.peak_tflops * 1e12 * e.fused_attention_bwd_fraction * fill) +
                        2 * e.kernel_launch_us * 1e-6;  // with its rowsum(dO∘O) pre-pass
  } else {
    out.fwd.attention = batched_gemm_seconds(g, batches, s, s, dh, eb) + batched_gemm_seconds(g, batches, s, dh, s, eb);
    out.bwd.attention = 2 * batched_gemm_seconds(g, batches, s, dh, s, eb) +   // dQ, dK
                        batched_gemm_seconds(g, batches, s, s, dh, eb) +       // dP
                        batched_gemm_seconds(g, batches, dh, s, s, eb);        // dV
  }

  // Memory-bound kernels, bytes moved (activations 2 B, masks 1 B).
  const double e_sp = n * h / (sp ? t : 1);  // elements in the sequence-parallel regions
  const double e_ffn = n * f / t, e_tp = n * h / t;
  // Unfused: the [b, a/t, s, s] scores pass through HBM (fused scale-mask-softmax, dropout);
  // the fused kernel keeps them on chip (its backward pre-pass reads O and dO: 4·e_tp bytes).
  const double scores = fused ? 0.0 : batches * s * s;
  const double core_fwd_bytes = 4 * scores + 5 * scores;  // fused scale-mask-softmax; dropout
  // RoPE rotates Q and K (read, write: a + g heads of d); its backward does the same to dQ, dK.
  const double e_rope = rope ? n * (a + md.query_groups()) * dh / t : 0.0;
  const double fwd_bytes = 2 * 4 * e_sp      // two norms: read x, write y
                           + 2 * 7 * e_sp    // two bias-dropout-adds: read 2, write 1, mask
                           + (swiglu ? 6 : 4) * e_ffn  // fused bias-GeLU; SwiGLU reads gate and up, writes one
                           + 4 * e_rope
                           + core_fwd_bytes
                           + 4 * e_tp;       // context permute to [s, b, h/t]
  const double bwd_bytes = 2 * 6 * e_sp      // norm backward: read x, dy; write dx
                           + 2 * 5 * e_sp    // dropout backward: read dy, mask; write dx
                           + 2 * 6 * e_sp    // residual gradient accumulation
                           + (swiglu ? 10 : 6) * e_ffn  // GeLU backward; SwiGLU reads dy, gate, up, writes dgate, dup
                           + 4 * e_rope
                           + 6 * scores + 5 * scores  // softmax and dropout backward
                           + (fused ? 4 * e_tp : 0.0)
                           + 4 * e_tp;
  // The byte counts above are for 2-byte activations (masks 1 B); fp32 doubles them.
  const double scale = eb / 2;
  out.fwd.memory = memory_seconds(g, scale * fwd_bytes, 8);
  out.bwd.memory = memory_seconds(g, scale * bwd_bytes, 10);

  out.attention_core.attention = out.fwd.attention;
  out.attention_core.memory = memory_seconds(g, scale * core_fwd_bytes, 2);

  // Tensor-parallel collectives on the full activation [s, b, h].
  if (t > 1) {
    const double bytes = eb * n * h;
    const double ar = collective_seconds(c, Collective::all_reduce, bytes, t, 1);
    const double ag = collective_seconds(c, Collective::all_gather, bytes, t, 1);
    const double rs = collective_seconds(c, Collective::reduce_scatter, bytes, t, 1);
    if (!sp) {
      out.fwd.comm = 2 * ar;  // after the projection and fc2 (row-parallel)
      // Input-gradient all-reduce of QKV and fc1 runs during their weight-gradient GEMMs.
      out.bwd.comm = exposed(g.efficiency, ar, wgrad[0]) + exposed(g.efficiency, ar, wgrad[2]);
    } else if (!overlap_tp) {
      out.fwd.comm = 2 * ag + 2 * rs;
      // Backward of the reduce-scatters: all-gathers on the critical path. At QKV and fc1 the
      // LayerNorm output is re-gathered during dgrad and the input gradient reduce-scattered
      // during wgrad.
      out.bwd.comm = 2 * ag + exposed(g.efficiency, ag, dgrad[0]) + exposed(g.efficiency, rs, wgrad[0]) +
                     exposed(g.efficiency, ag, dgrad[2]) + exposed(g.efficiency, rs, wgrad[2]);
    } else {
      // --tp-comm-overlap: each all-gather is split and pipelined with the GEMM that consumes it,
      // each reduce-scatter with the GEMM that produces it, forward and backward.
      const Efficiency& e = g.efficiency;
      out.fwd.comm = exposed(e, ag, gemm_seconds(g, n, qkv / t, h, eb)) + exposed(e, rs, gemm_seconds(g, n, h, attn / t, eb)) +
                     exposed(e, ag, gemm_seconds(g, n, fc1 / t, h, eb)) + exposed(e, rs, gemm_seconds(g, n, h, f / t, eb));
      out.bwd.comm = exposed(e, ag, dgrad[1]) + exposed(e, ag, dgrad[3]) + exposed(e, ag, dgrad[0]) +
                     exposed(e, rs, wgrad[0]) + exposed(e, ag, dgrad[2]) + exposed(e, rs, wgrad[2]);
    }
  }
  return out;
}

EndCost end_cost(const ModelShape& md, const Cluster& c, int t, bool sp, int b, double eb) {
  const GpuSpec& g = c.gpu;
  const double s = md.seq_length, h = md.hidden_size;
  const double n = double(b) * s, v_shard = std::ceil(double(md.vocab_size) / t);
  const double e_sp = n * h / (sp ? t : 1);
  const double act = eb * n * h;
  const double scale = eb / 2;  // byte counts below are for 2-byte activations
  EndCost out;

  // Vocab-parallel embedding: each rank writes [n, h] with zeros for foreign ids, then the
  // ranks all-reduce (reduce-scatter under SP); position add and dropout.
  out.embedding_fwd.memory = memory_seconds(g, scale * (4 * n * h + 7 * e_sp), 3);
  out.embedding_bwd.memory = memory_seconds(g, scale * (5 * e_sp + 10 * n * h), 2);
  if (t > 1) {
    out.embedding_fwd.comm = collective_seconds(c, sp ? Collective::reduce_scatter : Collective::all_reduce, act, t, 1);
    if (sp) out.embedding_bwd.comm = collective_seconds(c, Collective::all_gather, act, t, 1);
  }

  // Final LayerNorm, logits GEMM [n, V/t] over h, vocab-parallel cross entropy in fp32, pass by
  // pass as Loom's model/cross_entropy.cpp and Megatron-Core's unfused VocabParallelCrossEntropy
  // run it, bytes per logit: convert to fp32 (eb + 4), row max (4), subtract the max (8), exp in
  // place (8), row sum (4), divide in place into the saved softmax (8); backward: scale by the
  // loss gradient in place (8) and convert back (4 + eb).
  out.logits_fwd.gemm = gemm_seconds(g, n, v_shard, h, eb);
  const double wgrad = gemm_seconds(g, h, v_shard, n, eb);
  out.logits_bwd.gemm = gemm_seconds(g, n, h, v_shard, eb) + wgrad;
  out.logits_fwd.memory = memory_seconds(g, scale * 4 * e_sp + (eb + 36) * n * v_shard, 7);
  out.logits_bwd.memory = memory_seconds(g, scale * 6 * e_sp + (eb + 12) * n * v_shard, 4);
  if (t > 1) {
    // Three all-reduces of per-token scalars (max, target logit, sum of exp).
    out.logits_fwd.comm = 3 * collective_seconds(c, Collective::all_reduce, 4 * n, t, 1);
    if (sp) {
      out.logits_fwd.comm += collective_seconds(c, Collective::all_gather, act, t, 1);
      out.logits_bwd.comm = exposed(g.efficiency, collective_seconds(c, Collective::reduce_scatter, act, t, 1), wgrad);
    } else {
      out.logits_bwd.comm = exposed(g.efficiency, collective_seconds(c, Collective::all_reduce, act, t, 1), wgrad);
    }
  }
  return out;
}

namespace {

// One pipeline exchange with a neighbouring stage per micro-batch and direction. Messages are
// [s/t, b, h] shards (SP, or Megatron's scatter-gather without SP, which then all-gathers
// inside the TP group). Neighbouring stages are t·d ranks apart.
double pipeline_message_seconds(const ModelShape& md, const Cluster& c, const TrainingSetup& setup,
                                const Layout& L) {
  const int t = L.tp, d = L.dp, b = L.micro_batch;
  const GpuSpec& g = c.gpu;
  const double bytes = element_bytes(setup.precision) * double(b) * md.seq_length * md.hidden_size / t;
  const bool cross_node = long(t) * d >= c.gpus_per_node;
  const Efficiency& e = g.efficiency;
  const double bw = cross_node ? g.inter_node_gbs * e.inter_node_comm_fraction
                               : g.intra_node_gbs * e.intra_node_comm_fraction;
  double msg = bytes / (bw * 1e9) + e.collective_latency_us * 1e-6;
  if (!L.sequence_parallel && t > 1)
    msg += collective_seconds(c, Collective::all_gather, bytes * t, t, 1);
  return msg;
}

// Work common to every stage, per micro-batch: its `layers_stage` layers (uneven stages differ)
// forward and backward, what they recompute, and (p > 1) one forward and one backward exchange
// per model chunk.
StageTime common_stage_time(const ModelShape& md, const Cluster& c, const TrainingSetup& setup, const Layout& L,
                            const LayerCost& layer, int layers_stage) {
  const int p = L.pp, v = L.vp;
  const int layers_chunk = layers_stage / v;
  StageTime common;
  common.add_forward(layer.fwd, layers_stage);
  common.add(layer.bwd, layers_stage);
  if (L.recompute.granularity == RecomputeGranularity::kFull) {
    const int recomputed = L.recompute.method != RecomputeMethod::kBlock
                               ? layers_stage
                               : v * std::min(std::max(0, int(L.recompute.num_layers.value_or(0))), layers_chunk);
    common.recompute = recomputed * layer.fwd.total();
  } else if (L.recompute.granularity == RecomputeGranularity::kSelective) {
    common.recompute = layers_stage * layer.attention_core.total();
  }
  if (p > 1) {
    common.pp_comm = 2.0 * v * pipeline_message_seconds(md, c, setup, L);
    common.forward += v * pipeline_message_seconds(md, c, setup, L);
  }
  return common;
}

// A collective of `comm` seconds on a group (size, stride) overlapped with `window` seconds of
// compute on other streams: what exceeds the window stays exposed, and the hidden part still
// slows the compute by the SMs and HBM traffic it takes. That contention is comm_overlap_fraction's
// complement at NVLink rate (fitted on the TP collectives) and scales with the group's bus
// bandwidth: a NIC-bound collective moves a fraction of the bytes per second an NVLink one does.
double exposed_behind(const Cluster& c, double comm, double window, int size, int stride) {
  const Efficiency& e = c.gpu.efficiency;
  const double nvlink = c.gpu.intra_node_gbs * e.intra_node_comm_fraction;
  const double rate = std::min(1.0, group_bus_gbs(c, size, stride) / nvlink);
  const double hidden = std::min(comm, window);
  return comm - hidden + (1 - e.comm_overlap_fraction) * rate * hidden;
}

// Data-parallel gradient reduction (fp32 gradients), parameter all-gather (bf16) with the
// distributed optimizer; all-reduce of the tied embedding between the end stages. `params`:
// parameters of the larger end stage; `critical`: the critical stage, per micro-batch.
// Overlapped as Megatron-Core does it (docs/planner.md, "DP communication"): bucket by bucket, the
// gradient reduction during the last micro-batch's backward (overlap_dp_comm) and the parameter
// gather during the first micro-batch's forward (overlap_param_gather); the last gradient bucket
// (the first layers, reduced after the backward ends) and the first parameter bucket (needed
// before the forward starts) are exposed whole.
double data_parallel_seconds(const ModelShape& md, const Cluster& c, const TrainingSetup& setup, const Layout& L,
                             double params, const StageTime& critical) {
  const int t = L.tp, p = L.pp, d = L.dp;
  double dp = 0;
  if (d > 1) {
    const double bucket = std::min(params, setup.dp_bucket_params > 0 ? setup.dp_bucket_params
                                                                      : std::max(40e6, 1e6 * d));
    const Collective reduce = L.distributed_optimizer ? Collective::reduce_scatter : Collective::all_reduce;
    const double grads = collective_seconds(c, reduce, 4 * params, d, t);
    const double backward = critical.total() - critical.forward;
    dp += setup.overlap_dp_comm
              ? std::max(exposed_behind(c, grads, backward, d, t), collective_seconds(c, reduce, 4 * bucket, d, t))
              : grads;
    if (L.distributed_optimizer) {
      const double gather = collective_seconds(c, Collective::all_gather, 2 * params, d, t);
      dp += setup.overlap_param_gather
                ? std::max(exposed_behind(c, gather, critical.forward, d, t),
                           collective_seconds(c, Collective::all_gather, 2 * bucket, d, t))
                : gather;
    }
  }
  if (p > 1 && md.share_embeddings_and_output_weights) {  // the tied embedding's gradient between the end stages
    const double embedding = std::ceil(double(md.vocab_size) / t) * md.hidden_size;
    dp += collective_seconds(c, Collective::all_reduce, 4 * embedding, 2, t * d * (p - 1));
  }
  return dp;
}

}  // namespace

TimeBreakdown step_time(const ModelShape& md, const Cluster& c, const TrainingSetup& setup,
                        const Layout& L, const LayerCost& layer, const EndCost& ends) {
  const int p = L.pp, v = L.vp, d = L.dp;
  const int micro_batches = setup.global_batch / (d * L.micro_batch);
  // Stage 0 adds the embedding, stage p − 1 the logits and loss; uneven stages (rules/layout_rules.h)
  // give the ends their own layer counts, the middle stages share one.
  const StageTime common = common_stage_time(md, c, setup, L, layer, L.stage_layers(md.num_layers, p > 2 ? 1 : 0));
  StageTime first = common_stage_time(md, c, setup, L, layer, L.stage_layers(md.num_layers, 0));
  StageTime last = common_stage_time(md, c, setup, L, layer, L.stage_layers(md.num_layers, p - 1));
  first.add_forward(ends.embedding_fwd, 1);
  first.add(ends.embedding_bwd, 1);
  last.add_forward(ends.logits_fwd, 1);
  last.add(ends.logits_bwd, 1);

  StageTime critical;
  double sum_stages;
  if (p == 1) {
    critical = first;
    critical.add_forward(ends.logits_fwd, 1);
    critical.add(ends.logits_bwd, 1);
    sum_stages = critical.total();
  } else {
    sum_stages = first.total() + last.total() + (p - 2) * common.total();
    critical = first.total() >= last.total() ? first : last;
    if (p > 2 && common.total() > critical.total()) critical = common;
  }

  TimeBreakdown out;
  out.gemm = micro_batches * critical.gemm;
  out.attention = micro_batches * critical.attention;
  out.memory_bound = micro_batches * critical.memory;
  out.tp_comm = micro_batches * critical.tp_comm;
  out.pp_comm = micro_batches * critical.pp_comm;
  out.recompute = micro_batches * critical.recompute;
  out.bubble = (sum_stages - critical.total()) / v;
  const double params = std::max({stage_params(md, L, 0), stage_params(md, L, p - 1),
                                  p > 2 ? stage_params(md, L, 1) : 0.0});
  out.dp_comm = data_parallel_seconds(md, c, setup, L, params, critical);

  // Adam on the owned shard (read grad, param, m, v; write param, m, v; write bf16 copy: 30 B),
  // gradient-norm read (4 B) of the owned shard, zeroing the local gradient buffer (4 B).
  const double owned = L.distributed_optimizer ? params / d : params;
  out.optimizer = memory_seconds(c.gpu, owned * 34 + params * 4, 12);
  return out;
}

TimeBreakdown step_time(const ModelShape& m, const Cluster& c, const TrainingSetup& setup,
                        const Layout& layout) {
  return step_time(m, c, setup, layout,
                   layer_cost(m, c, layout.tp, layout.sequence_parallel, layout.micro_batch,
                              element_bytes(setup.precision), setup.fused_attention, setup.overlap_tp_comm),
                   end_cost(m, c, layout.tp, layout.sequence_parallel, layout.micro_batch,
                            element_bytes(setup.precision)));
}

}  // namespace loom::planner
