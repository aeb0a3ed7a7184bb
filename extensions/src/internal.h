// Internal helpers of libloom_ops shared by the CPU, CUDA and Meta implementations:
// argument checks (one place, so every backend rejects the same inputs with the same
// message), dtype rules, dropout layouts and softmax mask rows.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "loom_ops/dropout_layout.h"

namespace loom::ops::internal {

/// Statistics / parameter dtype: float64 for float64 inputs, float32 otherwise.
at::ScalarType acc_dtype(at::ScalarType input);

/// A 1-d parameter (gamma, beta, bias) as a contiguous tensor of acc_dtype(input).
at::Tensor as_acc_param(const at::Tensor& param, at::ScalarType input);

void check_floating(const char* op, const char* arg, const at::Tensor& t);
void check_same_device(const char* op, const at::Tensor& a, const char* arg,
                       const at::Tensor& b);
/// param must be 1-d of size `size` with the input's dtype or float32.
void check_param(const char* op, const char* arg, const at::Tensor& param,
                 const at::Tensor& input);
void check_probability(const char* op, double p);

void check_layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);
void check_layer_norm_backward(const at::Tensor& dy, const at::Tensor& x,
                               const at::Tensor& weight, const at::Tensor& mean,
                               const at::Tensor& rstd);
void check_bias_dropout_add(const at::Tensor& x, const std::optional<at::Tensor>& bias,
                            const at::Tensor& residual, double p);
void check_softmax(const at::Tensor& x, const std::optional<at::Tensor>& mask);
void check_softmax_backward(const at::Tensor& dy, const at::Tensor& y);
void check_bias_gelu(const at::Tensor& x, const at::Tensor& bias);
void check_rms_norm(const at::Tensor& x, const at::Tensor& weight);
void check_rms_norm_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& weight,
                             const at::Tensor& rstd);
/// x [b, heads, s, d] (`arg` names it: input or grad_out), cos and sin [b or 1, 1, s, r], r even
/// in [2, d], x's dtype and device.
void check_rotary(const char* op, const char* arg, const at::Tensor& x, const at::Tensor& cos,
                  const at::Tensor& sin);
void check_swiglu(const at::Tensor& x);
void check_swiglu_backward(const at::Tensor& dy, const at::Tensor& x);
/// x.shape[:-1] + [last]: the shape of a row-wise op's output with rows of `last` elements.
std::vector<int64_t> with_last_dim(const at::Tensor& x, int64_t last);

/// Layout of `local` (its logical shape) as the block `offset` of `global_shape`;
/// errors name `op`.
ElementLayout dropout_layout(const char* op, const at::Tensor& local,
                             at::IntArrayRef global_shape, at::IntArrayRef offset);

/// A softmax mask prepared for kernels: row r of the input (x viewed as [rows, sk]) uses
/// mask elements data.data_ptr<bool>() + row_offsets[r] + j, j < sk. row_offsets is int64
/// on x's device.
struct MaskRows {
  at::Tensor data;
  at::Tensor row_offsets;
};
MaskRows prepare_mask(const at::Tensor& mask, const at::Tensor& x);

}  // namespace loom::ops::internal
