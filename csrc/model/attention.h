// Self-attention of a GPT layer under tensor parallelism: fused QKV column-parallel linear
// whose rows are grouped per head [q|k|v] (so a contiguous 1/t split gives each rank whole
// heads), causal core attention on this rank's heads, row-parallel output projection.
// With selective recomputation the core (QKᵀ·scale, causal mask, softmax, dropout, ×V) is
// loom::ops::core_attention, which saves only Q, K, V (docs/design/sp_sar.md). With
// use_flash_attention the core is at::scaled_dot_product_attention (causal, the same 1/sqrt(d)
// scale), which stores no s×s activations at all (docs/design/sp_sar.md, "Fused attention").
#pragma once
#include <ATen/core/Tensor.h>

#include <utility>

#include "model/dropout_context.h"
#include "model/gpt_config.h"
#include "model/parallel_linear.h"

namespace loom::model {

class KvCache;

class ParallelAttention {
 public:
  /// `layer` is the global layer number (initialisation names and dropout keys).
  ParallelAttention(const GptConfig& config, int layer, runtime::CommunicatorPtr tp,
                    const at::TensorOptions& options);
  /// x [s(/t), b, h] (the LayerNorm output) -> (projection [s(/t), b, h] before its bias,
  /// the projection bias [h]).
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& x, const DropoutContext& dropout) const;
  /// Inference (cached_forward.cpp): x [n, b, h] of n new positions (no sequence parallelism,
  /// no dropout); appends their keys and values to `cache` and attends over every cached
  /// position with the offset causal mask (kv_cache.h). Same outputs as forward().
  std::pair<at::Tensor, at::Tensor> forward_cached(const at::Tensor& x, KvCache& cache) const;
  void collect(ParamList& out) const;

 private:
  GptConfig config_;
  int layer_;
  runtime::CommunicatorPtr tp_;
  ColumnParallelLinear qkv_;
  RowParallelLinear proj_;
};

}  // namespace loom::model
