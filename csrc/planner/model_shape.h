// The model being planned: a GPT-3-style decoder (pre-LayerNorm, learned positions, GeLU MLP,
// tied input/output embedding) described by its shape, plus the parameter and FLOP counts the
// planner reports. Formulas follow docs/design/sp_sar.md ("FLOPs") and docs/design/planner_sources.md.
#pragma once
#include <cstdint>
#include <string>

namespace loom::planner {

/// Shape of a GPT model. All sizes are element counts (not bytes).
struct ModelShape {
  int num_layers = 0;           ///< L, transformer layers
  int hidden_size = 0;          ///< h
  int num_attention_heads = 0;  ///< a; h % a == 0
  int ffn_hidden_size = 0;      ///< MLP inner size; 0 means 4h
  int seq_length = 2048;        ///< s, tokens per sample
  int vocab_size = 51200;       ///< V as trained (already padded, e.g. 51200)

  int ffn() const { return ffn_hidden_size > 0 ? ffn_hidden_size : 4 * hidden_size; }
  int head_dim() const { return hidden_size / num_attention_heads; }

  /// Throws std::invalid_argument naming the field when a size is non-positive or h % a != 0.
  void validate() const;

  /// Exact parameter count: per layer 4h² + 2h·ffn (weights) + 3h + ffn + h + 4h (QKV, proj,
  /// fc1, fc2 biases; two LayerNorms), plus word (V·h) and position (s·h) embeddings and the
  /// final LayerNorm (2h). Tied output layer is not counted twice. With ffn = 4h this is
  /// 12Lh²(1 + 13/(12h)) + (V+s)h + 2h.
  double parameter_count() const;

  /// Model FLOPs per sample (no recomputation): forward 24sh² + 4s²h per layer (with ffn=4h;
  /// general: s(8h² + 4h·ffn) + 4s²h) and the logits 2shV, times 3 for forward + backward.
  /// For ffn=4h this is 72·L·s·h²·(1 + s/(6h) + V/(12hL)) (Korthikanti et al. 2022).
  double model_flops_per_sample() const;

  /// FLOPs per sample counting full recomputation of every layer (one more forward of the
  /// layers, not of the logits): 96·L·s·h²·(1 + s/(6h) + V/(16hL)) for ffn=4h (Narayanan et
  /// al. 2021, the figure their TFLOP/s per GPU counts).
  double full_recompute_flops_per_sample() const;

  /// "L/h/a" summary such as "96L h12288 a96 s2048 V51200".
  std::string summary() const;
};

/// GPT-3 shape for a parameter budget in billions, following the NeMo hyperparameter tool's
/// bands (hidden size and heads by size: <0.25B → 768/12, <0.5 → 1024/16, <1 → 1536/16,
/// <2 → 2048/16, <3 → 2560/32, <4.5 → 3072/32, <8 → 4096/32, <15 → 5120/40, <25 → 6144/48,
/// <52 → 8192/64, <105 → 10240/80, <205 → 12288/96, <805 → 20480/128, ≤1105 → 25600/160) and
/// its layer rule: the layer count whose P = 12·L·h²·(1 + 13/(12h) + (V+s)/(12Lh)) lies within
/// a margin of the budget, preferring powers of two, then multiples of 16, of 2, of 5, then any
/// count, the margin widening from 1% in 1% steps. 0.126 → 12 layers, 5 → 24, 20 → 44,
/// 175 → 96. Throws std::invalid_argument outside (0, 1105].
ModelShape gpt3_shape_for_size(double billions, int seq_length = 2048, int vocab_size = 51200);

/// P of docs/design/planner_sources.md for a shape (the formula the layer rule uses), in parameters.
double gpt3_size_formula(int num_layers, int hidden_size, int seq_length, int vocab_size);

}  // namespace loom::planner
