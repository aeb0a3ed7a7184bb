// Self-attention of a GPT or Llama layer under tensor parallelism: fused QKV column-parallel
// linear, causal core attention on this rank's heads, row-parallel output projection.
//
// QKV rows are grouped per query group, Megatron-Core's layout: [q heads of group 0 (a/g · d
// rows), k₀ (d), v₀ (d), q heads of group 1, k₁, v₁, ...] with g = num_query_groups K/V heads
// (g = a, plain multi-head attention, is per head [q|k|v]). A contiguous 1/t split therefore
// gives each rank g/t whole groups (rules::architecture_violations requires g % t == 0), and the
// full tensor is the same for every t. Each K/V head serves the a/g query heads of its group
// (grouped-query attention; expanded to the query heads for the core, stored once in the cache).
// With RoPE (rotary.h) Q and K are rotated by their positions before the core. The QKV bias
// (same per-group rows) exists with model.bias or model.qkv_bias (Qwen2), the projection's with
// model.bias only. Heads are d = head_dim() wide (model.kv_channels, else h / a); the
// projection maps the a·d context features back to h.
//
// With selective recomputation the core (QKᵀ·scale, causal mask, softmax, dropout, ×V) is
// loom::ops::core_attention, which saves only Q, K, V (docs/design/sp_sar.md). With
// use_flash_attention the core is at::scaled_dot_product_attention (causal, the same 1/sqrt(d)
// scale), which stores no s×s activations at all (docs/design/sp_sar.md, "Fused attention").
// Packed rows (docs/design/finetune.md, "Packed sequences") add the document mask in all three
// cores: each position attends to the earlier positions of its own example only.
#pragma once
#include <ATen/core/Tensor.h>

#include <tuple>
#include <utility>

#include "model/document_mask.h"
#include "model/dropout_context.h"
#include "model/gpt_config.h"
#include "model/parallel_linear.h"
#include "model/rotary.h"

namespace loom::model {

class KvCache;

class ParallelAttention {
 public:
  /// `layer` is the global layer number (initialisation names and dropout keys).
  ParallelAttention(const GptConfig& config, int layer, runtime::CommunicatorPtr tp,
                    const at::TensorOptions& options);
  /// x [s(/t), b, h] (the norm's output), `rotary` the tables of the whole sequence [b, 1, s, r]
  /// (inactive: learned positions), `document` packed rows' mask of the whole sequence
  /// (document_mask.h; inactive: each row one sequence) -> (projection [s(/t), b, h] before its
  /// bias, the projection bias [h], undefined without bias).
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& x, const DropoutContext& dropout,
                                            const RotaryTables& rotary = {},
                                            const DocumentMask& document = {}) const;
  /// Inference (cached_forward.cpp): x [n, b, h] of n new positions (no sequence parallelism,
  /// no dropout), `rotary` the tables of their positions [b, 1, n, r]; appends their keys and
  /// values (this rank's g/t K/V heads) to `cache` and attends over every cached position with
  /// the offset causal mask (kv_cache.h). Same outputs as forward(). `served`: the served LoRA
  /// adapters' tokens (lora_serving.h; null: the base alone).
  std::pair<at::Tensor, at::Tensor> forward_cached(const at::Tensor& x, KvCache& cache,
                                                   const RotaryTables& rotary = {},
                                                   const LoraBatch* served = nullptr) const;
  void collect(ParamList& out) const;

 private:
  /// The QKV projection of x, split into q [b, a/t, s, d] and k, v [b, g/t, s, d], q and k
  /// rotated when `rotary` is active; `dropout` for a LoRA adapter's input (null: none);
  /// `served` the served adapters' tokens (inference; null: none).
  std::tuple<at::Tensor, at::Tensor, at::Tensor> project_qkv(const at::Tensor& x, const RotaryTables& rotary,
                                                             const DropoutContext* dropout = nullptr,
                                                             const LoraBatch* served = nullptr) const;
  /// k or v [b, g/t, s, d] -> [b, a/t, s, d]: each K/V head repeated for its a/g query heads.
  at::Tensor expand_groups(const at::Tensor& kv) const;

  GptConfig config_;
  int layer_;
  runtime::CommunicatorPtr tp_;
  ColumnParallelLinear qkv_;
  RowParallelLinear proj_;
};

}  // namespace loom::model
