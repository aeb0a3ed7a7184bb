// Loom's fused transformer ops, the C++ face of the `loom` torch library (libloom_ops.so).
//
// Every function below calls the registered op through the dispatcher, so it runs the CPU
// or CUDA kernel of its inputs' device and records autograd when inputs require grad
// (backward kernels are the `*_backward` ops). Python sees the same ops as
// torch.ops.loom.<name> after torch.ops.load_library("<build>/lib/libloom_ops.so").
// Schemas: extensions/src/schemas.cpp. Dtypes: float32, bfloat16, float16 on CPU and CUDA;
// float64 on CPU (for gradcheck). Reductions and statistics are fp32 (fp64 for float64).
// Shape or dtype errors throw c10::Error naming the op and argument.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include "loom_ops/dropout_layout.h"
#include "loom_ops/philox.h"

namespace loom::ops {

/// Identifies one dropout draw: the run seed and the site's stream (philox.h).
struct DropoutKey {
  uint64_t seed = 0;
  uint64_t stream = 0;
};

/// dropout_stream(step, layer, site) with range checks (step < 2^40, layer < 2^16,
/// site < 2^8); throws std::invalid_argument naming the argument out of range.
uint64_t make_dropout_stream(uint64_t step, int64_t layer, int64_t site);

/// "The local tensor is the block at `offset` of a global tensor of shape `global_shape`"
/// (dropout_layout.h explains the index map and gives the GPT examples). Default: the local
/// tensor is the whole global tensor.
struct GlobalBlock {
  std::vector<int64_t> global_shape;
  std::vector<int64_t> offset;
};

/// Dropout parameters of one site: drop probability p in [0, 1], key, global block.
struct DropoutSpec {
  double p = 0.0;
  DropoutKey key;
  GlobalBlock block;
};

// ---- dropout ------------------------------------------------------------------------------

/// Keep mask (bool, shape and device of `like`) of the dropout `spec` describes: element
/// is kept iff its Philox word < round((1 - p) 2^32) (philox.h). Identical on CPU and CUDA
/// and for every way of splitting the global tensor.
at::Tensor dropout_keep_mask(const at::Tensor& like, const DropoutSpec& spec);

/// x * keep / (1 - p), differentiable (backward regenerates the same mask).
at::Tensor dropout(const at::Tensor& x, const DropoutSpec& spec);

/// residual + dropout(x + bias): x, residual [..., h] of one dtype, bias [h] or none.
/// Backward: d_residual = g, d_x = dropout(g), d_bias = sum of d_x over the tokens held
/// locally (under sequence parallelism the caller all-reduces it over the TP group).
at::Tensor bias_dropout_add(const at::Tensor& x, const std::optional<at::Tensor>& bias,
                            const at::Tensor& residual, const DropoutSpec& spec);

// ---- LayerNorm -----------------------------------------------------------------------------

/// LayerNorm over the last dimension: y = (x - mean) * rstd * weight + bias, with
/// rstd = 1 / sqrt(var + eps) (biased variance), statistics in fp32. weight and bias [h]
/// in x's dtype or float32. Differentiable in x, weight, bias.
at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                      double eps);

/// The same, also returning mean and rstd (float32, float64 for float64 input; shape
/// x.shape[:-1]); mean and rstd are not differentiable.
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_with_stats(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps);

/// Backward of layer_norm: (dx, dweight, dbias) where dweight/dbias sum over the local
/// tokens only (all-reduce them over TP under sequence parallelism).
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& weight,
    const at::Tensor& mean, const at::Tensor& rstd);

// ---- softmax -------------------------------------------------------------------------------

/// softmax(scale * x) over the last dim of x [..., sq, sk], with masked entries excluded:
/// mask (bool, broadcastable to x, true = masked out, Megatron's convention) and/or causal
/// (key j masked for query i when j > i + sk - sq). A fully masked row gives all zeros.
at::Tensor scaled_masked_softmax(const at::Tensor& x, const std::optional<at::Tensor>& mask,
                                 double scale, bool causal);

/// dx = scale * y * (dy - sum(dy * y)) given the forward output y.
at::Tensor scaled_masked_softmax_backward(const at::Tensor& grad_out, const at::Tensor& y,
                                          double scale);

// ---- attention -----------------------------------------------------------------------------

/// Core attention with selective recomputation (Korthikanti et al. 2022, §5):
///   out = dropout(scaled_masked_softmax(q kᵀ, mask, scale, causal)) v
/// q [b, a, sq, d], k [b, a, sk, d], v [b, a, sk, dv] (any strides) -> out [b, a, sq, dv].
/// Only q, k, v are saved; backward recomputes scores, probabilities and the dropout mask.
/// The dropout's GlobalBlock describes the probability tensor [b, a, sq, sk] (e.g.
/// global [B, A, s, s], offset [b0, r * a/t, 0, 0] for TP rank r).
at::Tensor core_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const std::optional<at::Tensor>& mask, double scale, bool causal,
                          const DropoutSpec& dropout);

// ---- GeLU ----------------------------------------------------------------------------------

/// gelu_tanh(x + bias) = 0.5 u (1 + tanh(sqrt(2/pi) (u + 0.044715 u^3))), u = x + bias;
/// x [..., f], bias [f]. Differentiable in x and bias.
at::Tensor bias_gelu(const at::Tensor& x, const at::Tensor& bias);

/// d/dx of bias_gelu times grad_out (d/dbias is its sum over tokens).
at::Tensor bias_gelu_backward(const at::Tensor& grad_out, const at::Tensor& x,
                              const at::Tensor& bias);

// ---- the Llama family (docs/design/llama.md) -----------------------------------------------

/// RMSNorm (Zhang & Sennrich 2019) over the last dimension: y = x · rstd · weight with
/// rstd = 1 / sqrt(mean(x²) + eps), the statistic and the products in fp32 (fp64 for float64)
/// and y rounded once to x's dtype. weight [h] in x's dtype or float32. Differentiable in x
/// and weight.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

/// The same, also returning rstd (float32, float64 for float64 input; shape x.shape[:-1];
/// not differentiable).
std::tuple<at::Tensor, at::Tensor> rms_norm_with_rstd(const at::Tensor& x, const at::Tensor& weight,
                                                      double eps);

/// Backward of rms_norm: (dx, dweight), xhat = x · rstd, g = grad_out · weight:
/// dx = rstd (g − xhat · mean(g · xhat)), dweight = Σ grad_out · xhat over the local tokens
/// (all-reduce over TP under sequence parallelism), in weight's dtype.
std::tuple<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& grad_out, const at::Tensor& x,
                                                     const at::Tensor& weight, const at::Tensor& rstd);

/// Rotary position embedding, rotate-half pairing (Megatron-Core's and transformers' RoPE):
/// x [b, heads, s, d] (any strides) and the tables cos, sin [b or 1, 1, s, r] (r even, r <= d,
/// x's dtype: csrc/model/rotary.h builds them) -> out [b, heads, s, d] contiguous, where for
/// i < r/2 (x₁ = x[..., i], x₂ = x[..., i + r/2], c/s the tables at i and i + r/2)
///   out[..., i] = x₁ c[i] − x₂ s[i],  out[..., i + r/2] = x₂ c[i + r/2] + x₁ s[i + r/2]
/// and dimensions r.. d pass through (partial rotary). Computed in fp32 (fp64 for float64).
/// Differentiable in x; cos and sin must not require grad (an error says so).
at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

/// d/dx of rotary times grad_out: the rotation by −θ (the transpose of the forward).
at::Tensor rotary_backward(const at::Tensor& grad_out, const at::Tensor& cos, const at::Tensor& sin);

/// SwiGLU (Shazeer 2020) on Loom's fused gate/up projection: x [..., 2f] holds interleaved
/// pairs [g₀, u₀, g₁, u₁, ...] (csrc/model/mlp.h) -> silu(g) · u [..., f], in fp32 (fp64 for
/// float64) rounded once. Differentiable.
at::Tensor swiglu(const at::Tensor& x);

/// d/dx of swiglu times grad_out [..., f] -> [..., 2f]: d/dg = grad · u · σ(g)(1 + g(1 − σ(g))),
/// d/du = grad · silu(g), interleaved as x.
at::Tensor swiglu_backward(const at::Tensor& grad_out, const at::Tensor& x);

}  // namespace loom::ops
