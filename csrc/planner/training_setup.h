// What is trained and how, apart from the layout: batch, precision, memory headroom, overlap.
#pragma once
#include "planner/layout.h"

namespace loom::planner {

/// How the optimizer updates the parameters (train/optim/adamw.h), which sets its temporaries:
/// per tensor (model.optim.name adam/adamw: up to 8 B per element of the largest tensor),
/// for-each ops per (bucket, weight-decay) group (fused_adam off CUDA: 8 B per element of the
/// largest group) or ATen's fused kernel (fused_adam on CUDA: none).
enum class OptimizerUpdate { kPerTensor, kForEach, kFused };

struct TrainingSetup {
  /// global_batch_size, samples per step: the batch the search keeps fixed (its candidates'
  /// Layout::global_batch; the time and memory models read it here).
  int global_batch = 0;
  Precision precision = Precision::kBf16;
  /// Memory kept free on every GPU: a fixed reserve (CUDA context, NCCL and cuBLAS workspaces)
  /// plus a fraction of capacity for allocator fragmentation.
  double reserve_gib = 2.0;
  double fragmentation_fraction = 0.05;
  /// DP gradient reduction overlapped with the last micro-batch's backward (Megatron-Core's
  /// overlap_grad_reduce). Off: reduced after the backward, as docs/design/parallel_layout.md prescribes.
  bool overlap_dp_comm = false;
  /// Distributed optimizer: the parameter all-gather after the step is overlapped with the next
  /// step's first forward, bucket by bucket (Megatron-Core's overlap_param_gather, Loom's
  /// model.optim.overlap_param_sync). Off: gathered before the forward.
  bool overlap_param_gather = false;
  /// Parameters per DP bucket; 0: Megatron-Core's default max(40 000 000, 1 000 000 · d)
  /// (model.optim.ddp_bucket_size). With overlap, the last gradient bucket's reduction and the
  /// first parameter bucket's gather have nothing left to hide behind.
  double dp_bucket_params = 0;
  /// The attention core runs as one fused kernel (model.use_flash_attention): no s×s scores in
  /// memory or HBM traffic, its time from the fused-attention efficiencies (time_model.h);
  /// selective recompute is then illegal (rules::fused_attention_violations).
  bool fused_attention = false;
  /// model.attention_dropout > 0: the unfused attention core keeps the dropout output beside
  /// the softmax output (one more [b, a/t, s, s] tensor). GPT-3 recipes train with 0.1, Llama's
  /// with 0.
  bool attention_dropout = true;
  /// Tensor-parallel collectives overlapped with the GEMMs next to them in forward as well as
  /// backward (Megatron-Core's --tp-comm-overlap, Transformer Engine's userbuffers): every
  /// all-gather / reduce-scatter hides comm_overlap_fraction behind its GEMM.
  bool overlap_tp_comm = false;
  /// The optimizer's update kernel (memory temporaries only; the time model costs every kind as
  /// the fused one).
  OptimizerUpdate optimizer_update = OptimizerUpdate::kFused;
};

}  // namespace loom::planner
