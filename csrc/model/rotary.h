// Rotary position embeddings (RoPE) applied to the queries and keys of every head, with the
// "rotate-half" pairing that Megatron-Core and transformers' LlamaForCausalLM use: dimension i
// rotates with dimension i + d/2 by angle position · θ^(-2i/d), i < d/2 (docs/design/llama.md).
// An ATen composition (no fused kernel yet). The angles come from the position ids, so the
// training forward, every tensor/pipeline layout and the cached decode (positions from the
// cache) rotate each token by its own position.
#pragma once
#include <ATen/core/Tensor.h>

namespace loom::model {

/// cos and sin of every (row, position, dimension) angle, [b, 1, s, d] in the activations'
/// dtype; undefined (inactive) for learned absolute positions.
struct RotaryTables {
  at::Tensor cos, sin;
  bool active() const { return cos.defined(); }
};

/// The tables of `position_ids` [b, s] (int64, any device) for heads of `head_dim` (even) and
/// base `base`: inverse frequencies base^(-2i/d) and the angles computed in float32 (as
/// transformers does, whatever the model dtype), then cast to `dtype`. Throws
/// std::invalid_argument for an odd head_dim or position_ids not [b, s].
RotaryTables rotary_tables(const at::Tensor& position_ids, int64_t head_dim, double base, at::ScalarType dtype);

/// x [b, heads, s, d] rotated: x · cos + rotate_half(x) · sin, rotate_half(x) = [-x₂, x₁] for
/// the halves x₁ = x[..., :d/2], x₂ = x[..., d/2:]. Differentiable (autograd through ATen).
at::Tensor apply_rotary(const at::Tensor& x, const RotaryTables& tables);

}  // namespace loom::model
