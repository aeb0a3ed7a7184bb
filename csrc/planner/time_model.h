// Speed model: seconds per training step of a layout, broken into the terms of docs/planner.md.
//
// Primitive costs (hardware.h's Efficiency holds the parameters):
//   GEMM  C[M,N] = A[M,K]·B[K,N]:  2MNK / (peak · f_max · Π_{x∈{M,N,K}} x/(x + x0))
//         + e·M·N / (HBM · memory_fraction) + launch
//         (f_max = gemm_max_fraction, x0 = gemm_half_dim: small dimensions under-fill the
//         tensor cores and tiles; the second term writes the result C (e bytes per element) in
//         the tiles' epilogue, which the main loop's pipelined operand loads do not hide: its
//         share grows as K shrinks and with the GPU's peak / bandwidth ratio (Hopper's is ~1.9×
//         Ampere's), the "arithmetic intensity" the Megatron-LM README gives for small models'
//         lower MFU. The attention score GEMMs use the same curve with their head dimension, so
//         no separate attention efficiency is needed)
//   memory-bound kernel: bytes / (HBM bandwidth · memory_fraction) + launch
//   ring collective over n GPUs of B bytes: all-reduce 2(n−1)/n·B/bw + 2(n−1)·α,
//         all-gather / reduce-scatter (n−1)/n·B/bw + (n−1)·α, with bw the NCCL bus bandwidth of
//         the group (NVLink inside a node; across nodes k·NIC for k members per node)
// A transformer layer is costed op by op (docs/design/sp_sar.md regions): four GEMMs, the attention score
// and context batched GEMMs, LayerNorm / bias-dropout-add / bias-GeLU / softmax / dropout by
// bytes moved, and the tensor-parallel collectives (all-reduce, or all-gather + reduce-scatter
// under SP). Backward GEMMs cost twice the forward (dgrad + wgrad); the backward collectives at
// the column-parallel inputs overlap the weight-gradient GEMM (Megatron's asynchronous
// all-reduce) and the SP re-gather of the LayerNorm output overlaps the input-gradient GEMM.
// DP: gradient all-reduce (or reduce-scatter + parameter all-gather with the distributed
// optimizer); overlapped (TrainingSetup::overlap_dp_comm, overlap_param_gather) bucket by bucket
// behind the last micro-batch's backward / the first one's forward, the last / first bucket and
// what exceeds the window exposed, the hidden part slowing compute by (1 − comm_overlap_fraction)
// at NVLink rate scaled by the group's bus bandwidth (docs/planner.md, "DP communication").
// Pipeline: with per-micro-batch stage times T_i, step = m·max T_i + (Σ T_i − max T_i)/v, i.e.
// the (p−1)/(v·m) bubble of docs/design/parallel_layout.md generalised to unequal end stages.
// Calibrated A100 parameters (data/gpus.json "a100"; docs/planner.md, "Speed model"):
// gemm_max_fraction 0.78, gemm_half_dim 16, memory_fraction 0.65, NVLink bus fraction 0.8,
// network bus fraction 0.7, 10 µs per collective step, 4 µs per kernel, 50% of an overlapped
// collective hidden (at NVLink rate). They reproduce Korthikanti et al. 2022 and Narayanan et
// al. 2021 with mean error 3.4% (tests/planner/test_validation.cpp, which also asserts the
// held-out groups' targets).
#pragma once
#include "planner/hardware.h"
#include "planner/layout.h"
#include "planner/model_shape.h"
#include "planner/training_setup.h"

namespace loom::planner {

/// Seconds per step by term. Terms add up to total().
struct TimeBreakdown {
  double gemm = 0;          ///< dense GEMMs of layers and logits (forward + backward)
  double attention = 0;     ///< attention score / context batched GEMMs
  double memory_bound = 0;  ///< LayerNorm, dropout, GeLU, softmax, cross entropy, embedding
  double tp_comm = 0;       ///< exposed tensor/sequence-parallel collectives
  double pp_comm = 0;       ///< exposed pipeline send/receive
  double bubble = 0;        ///< pipeline fill and drain
  double dp_comm = 0;       ///< exposed data-parallel gradient reduction / parameter gather
  double recompute = 0;     ///< repeated forward work of activation recomputation
  double optimizer = 0;     ///< Adam step, gradient norm, gradient zeroing
  double total() const {
    return gemm + attention + memory_bound + tp_comm + pp_comm + bubble + dp_comm + recompute + optimizer;
  }
};

/// One pass (forward or backward) of one unit of work for one micro-batch on one GPU.
struct PassCost {
  double gemm = 0, attention = 0, memory = 0, comm = 0;
  double total() const { return gemm + attention + memory + comm; }
};

/// Seconds of a GEMM on `gpu` (see header comment).
double gemm_seconds(const GpuSpec& gpu, double m, double n, double k, double element_bytes = 2);
/// Seconds of `count` independent GEMMs of one shape run as one batched kernel (one launch),
/// e.g. the attention score and context products over b·a/t heads.
double batched_gemm_seconds(const GpuSpec& gpu, double count, double m, double n, double k,
                            double element_bytes = 2);
/// Achieved TFLOP/s of the GEMM model at a shape.
double gemm_tflops(const GpuSpec& gpu, double m, double n, double k, double element_bytes = 2);
/// Seconds of writing the results C[M,N] of `count` GEMMs (`element_bytes` per element) at the
/// memory-bound kernels' bandwidth: the epilogue that the tile pipeline does not overlap with
/// its main loop (see the header comment).
double gemm_output_seconds(const GpuSpec& gpu, double count, double m, double n, double element_bytes);
/// FLOPs a fused causal attention kernel executes forward over `count` heads × samples of
/// sequence length s and head dimension d: 4·count·s²·d·(s + 128)/(2s) (the causal tiles, the
/// 128-wide diagonal ones whole); its backward executes 2.5× that (Dao 2023, §3.1).
double fused_attention_fwd_flops(double count, double s, double head_dim);
/// Seconds of a memory-bound kernel moving `bytes`.
double memory_seconds(const GpuSpec& gpu, double bytes, int kernels);

enum class Collective { all_reduce, all_gather, reduce_scatter };
/// NCCL bus bandwidth (GB/s) of a group of `size` ranks spaced `stride` apart in rank order.
double group_bus_gbs(const Cluster& c, int size, int stride);
/// Seconds of a ring collective whose full (gathered / reduced) tensor has `bytes`.
double collective_seconds(const Cluster& c, Collective kind, double bytes, int size, int stride);

/// Costs of one transformer layer for one micro-batch (b samples) under TP t (stride 1), with
/// activations of `element_bytes` bytes (2: bf16/fp16, 4: fp32). `fused_attention`: the core is
/// one fused kernel each way (FLOPs of the causal tiles at fused_attention_{fwd,bwd}_fraction of
/// peak, no s² memory-bound passes); `overlap_tp_comm`: under SP every TP collective overlaps
/// its neighbouring GEMM (TrainingSetup::overlap_tp_comm).
struct LayerCost {
  PassCost fwd, bwd;
  PassCost attention_core;  ///< the forward part selective recompute repeats
};
LayerCost layer_cost(const ModelShape& m, const Cluster& c, int tp, bool sp, int micro_batch,
                     double element_bytes = 2, bool fused_attention = false, bool overlap_tp_comm = false);

/// Costs of the embedding (first stage) and final LayerNorm + logits + cross entropy (last).
struct EndCost {
  PassCost embedding_fwd, embedding_bwd, logits_fwd, logits_bwd;
};
EndCost end_cost(const ModelShape& m, const Cluster& c, int tp, bool sp, int micro_batch,
                 double element_bytes = 2);

/// Step time of a valid layout (divisibility checked by the caller). `layer` and `ends` must be
/// layer_cost / end_cost for the layout's (tp, sp, micro_batch); the search caches them.
TimeBreakdown step_time(const ModelShape& m, const Cluster& c, const TrainingSetup& setup,
                        const Layout& layout, const LayerCost& layer, const EndCost& ends);
/// Convenience overload computing the per-layer costs itself.
TimeBreakdown step_time(const ModelShape& m, const Cluster& c, const TrainingSetup& setup,
                        const Layout& layout);

}  // namespace loom::planner
