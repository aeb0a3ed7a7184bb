// What the parts of a model shape (rules/model_shape.h) count: the widths of its fused linear
// layers and one transformer layer's parameters by how tensor parallelism splits them, as
// model/transformer_layer.h builds them for every architecture option (GPT-3, Llama-family).
// ModelShape::parameter_count, the one FLOPs count and the planner's memory model are built from
// these. docs/planner.md ("Llama-family models") has the formulas. Torch-free.
#pragma once
#include <cstdint>

#include "rules/model_shape.h"

namespace loom {

/// Output width of the fused QKV projection: (a + 2·query_groups())·head_dim() (3h for MHA).
int64_t qkv_width(const ModelShape& m);
/// Output width of the MLP's first linear layer: ffn, or 2·ffn (gate and up) for fast-swiglu.
int64_t fc1_width(const ModelShape& m);
/// Parameters of one norm: h, or 2h for a LayerNorm with bias (RMSNorm has no bias).
double norm_parameters(const ModelShape& m);

/// One transformer layer's parameters, by how tensor parallelism splits them.
struct LayerParameters {
  /// The four linear weights h·qkv_width + a·d·h + h·fc1_width + ffn·h, split t ways.
  double weights = 0;
  /// The QKV bias (model.bias or model.qkv_bias) and the fc1 bias (model.bias), split t ways.
  double split_biases = 0;
  /// Whole on every TP rank: the projection and fc2 biases (model.bias: true) and the two norms.
  double replicated = 0;
  double per_rank(int tensor_parallel) const { return (weights + split_biases) / tensor_parallel + replicated; }
};
LayerParameters layer_parameters(const ModelShape& m);

}  // namespace loom
