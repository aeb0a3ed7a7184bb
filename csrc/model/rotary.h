// Rotary position embeddings (RoPE) applied to the queries and keys of every head, with the
// "rotate-half" pairing that Megatron-Core and transformers' LlamaForCausalLM use: of the r
// rotated dimensions, dimension i rotates with dimension i + r/2 by angle position · f_i,
// f_i = θ^(-2i/r), i < r/2 (docs/design/llama.md). r is the head dimension, or its leading
// int(head_dim · rotary_percentage) dimensions (partial rotary, Megatron-Core's rotary_percent:
// the rest pass through unrotated); Llama 3.1's rope scaling rescales the f_i. The rotation is
// loom::ops::rotary or an ATen composition (apply_rotary). The angles come from the position ids, so the training
// forward, every tensor/pipeline layout and the cached decode (positions from the cache) rotate
// each token by its own position.
#pragma once
#include <ATen/core/Tensor.h>

#include "rules/model_shape.h"

namespace loom::model {

/// cos and sin of every (row, position, rotated dimension) angle, [b, 1, s, r] in the
/// activations' dtype; undefined (inactive) for learned absolute positions.
struct RotaryTables {
  at::Tensor cos, sin;
  bool active() const { return cos.defined(); }
};

/// The inverse frequencies of `shape`'s RoPE, [r/2] float32 on `device`, r = shape.rotary_dim():
/// base ** (2i / r) in float32 and its reciprocal (the reference implementations' rounding), then
/// with shape.rope_scaling on, Llama 3.1's rule per frequency f of wavelength w = 2π/f:
/// w < old_context_len / high_freq_factor: f; w > old_context_len / low_freq_factor: f / factor;
/// otherwise (1 − s)·f/factor + s·f with s = (old_context_len / w − low) / (high − low).
/// Throws std::invalid_argument for r odd or < 2.
at::Tensor rotary_inverse_frequencies(const ModelShape& shape, at::Device device);

/// The tables of `position_ids` [b, s] (int64, any device) for `shape`'s RoPE
/// (rotary_inverse_frequencies): angles position · f computed in float32 (as transformers does,
/// whatever the model dtype), then cast to `dtype`. Throws std::invalid_argument for
/// position_ids not [b, s].
RotaryTables rotary_tables(const at::Tensor& position_ids, const ModelShape& shape, at::ScalarType dtype);

/// Plain RoPE over every one of `head_dim` (even) dimensions with base `base`: the tables of a
/// shape with that head dimension, rotary_percentage 1 and no scaling.
RotaryTables rotary_tables(const at::Tensor& position_ids, int64_t head_dim, double base, at::ScalarType dtype);

/// x [b, heads, s, d] rotated: its first r = tables' last size dimensions x_r become
/// x_r · cos + rotate_half(x_r) · sin, rotate_half(x_r) = [-x₂, x₁] for the halves
/// x₁ = x_r[..., :r/2], x₂ = x_r[..., r/2:]; dimensions r.. d pass through. Differentiable.
/// fused (model.apply_rope_fusion): loom::ops::rotary (one pass, reading x through its
/// strides); otherwise the ATen composition (autograd through ATen).
at::Tensor apply_rotary(const at::Tensor& x, const RotaryTables& tables, bool fused = false);

}  // namespace loom::model
