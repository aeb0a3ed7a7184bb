// Raw-pointer CUDA launchers of the loom kernels (defined in *.cu, which include no torch
// header). Every launcher runs on the given stream, checks the launch and throws
// std::runtime_error naming the kernel on failure. Element types: DType; parameters
// (gamma, beta, bias) and statistics are float32. All tensors contiguous.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "loom_ops/dropout_layout.h"

namespace loom::ops::cuda {

enum class DType { kFloat, kBFloat16, kHalf };

/// y = (x - mean) rstd gamma + beta over rows of length cols; mean/rstd [rows].
void layer_norm_forward(DType t, const void* x, const float* gamma, const float* beta, void* y,
                        float* mean, float* rstd, int64_t rows, int64_t cols, float eps,
                        cudaStream_t stream);

/// Floats of workspace layer_norm_backward needs for (rows, cols) on the current device.
int64_t layer_norm_backward_workspace(int64_t rows, int64_t cols);

/// dx, and dgamma/dbeta summed over all rows (float32 [cols]).
void layer_norm_backward(DType t, const void* dy, const void* x, const float* mean,
                         const float* rstd, const float* gamma, void* dx, float* dgamma,
                         float* dbeta, float* workspace, int64_t rows, int64_t cols,
                         cudaStream_t stream);

/// out = residual + keep * scale * (x + bias); bias (float [row length]) and residual may be
/// null. keep follows philox.h at the global indices of `layout`.
void dropout_forward(DType t, const void* x, const float* bias, const void* residual,
                     void* out, const ElementLayout& layout, uint64_t seed, uint64_t stream_id,
                     uint64_t threshold, float scale, cudaStream_t stream);

/// out[i] = keep bit of element i (0/1 bytes).
void dropout_mask(bool* out, const ElementLayout& layout, uint64_t seed, uint64_t stream_id,
                  uint64_t threshold, cudaStream_t stream);

/// Softmax of scale * x over rows of length sk (query i = row % sq for causal); mask row r
/// starts at mask + mask_rows[r] (mask may be null).
void softmax_forward(DType t, const void* x, const bool* mask, const int64_t* mask_rows,
                     void* y, int64_t rows, int64_t sq, int64_t sk, float scale, bool causal,
                     cudaStream_t stream);

/// dx = scale y (dy - <dy, y>) per row.
void softmax_backward(DType t, const void* dy, const void* y, void* dx, int64_t rows,
                      int64_t sk, float scale, cudaStream_t stream);

/// y = gelu_tanh(x + bias) (bias float [cols]).
void bias_gelu_forward(DType t, const void* x, const float* bias, void* y, int64_t rows,
                       int64_t cols, cudaStream_t stream);

/// dx = dy * gelu_tanh'(x + bias).
void bias_gelu_backward(DType t, const void* dy, const void* x, const float* bias, void* dx,
                        int64_t rows, int64_t cols, cudaStream_t stream);

/// RMSNorm: y = x rstd gamma over rows of length cols; rstd [rows].
void rms_norm_forward(DType t, const void* x, const float* gamma, void* y, float* rstd,
                      int64_t rows, int64_t cols, float eps, cudaStream_t stream);

/// dx, and dgamma summed over all rows (float32 [cols]); workspace of
/// layer_norm_backward_workspace(rows, cols) floats.
void rms_norm_backward(DType t, const void* dy, const void* x, const float* rstd,
                       const float* gamma, void* dx, float* dgamma, float* workspace, int64_t rows,
                       int64_t cols, cudaStream_t stream);

/// Rotate-half RoPE (loom_ops/ops.h `rotary`) of x [B, H, S, d] read through the element
/// strides (sb, sh, ss; unit stride within a row) into the contiguous out [B, H, S, d];
/// tables cos, sin [table_batches (1 or B), S, r] contiguous, in x's type. backward: the
/// transpose (rotary_backward).
void rotary(DType t, const void* x, int64_t sb, int64_t sh, int64_t ss, const void* cos,
            const void* sin, void* out, int64_t B, int64_t H, int64_t S, int64_t d, int64_t r,
            int64_t table_batches, bool backward, cudaStream_t stream);

/// SwiGLU of `pairs` interleaved (gate, up) pairs: y[i] = silu(x[2i]) x[2i + 1].
void swiglu_forward(DType t, const void* x, void* y, int64_t pairs, cudaStream_t stream);

/// dx [2 pairs] (interleaved as x) of dy [pairs] (ops.h swiglu_backward).
void swiglu_backward(DType t, const void* dy, const void* x, void* dx, int64_t pairs,
                     cudaStream_t stream);

}  // namespace loom::ops::cuda
