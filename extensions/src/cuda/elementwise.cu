// Elementwise CUDA kernels: dropout (+ bias + residual), the dropout keep mask, bias+GeLU
// forward/backward. Each thread handles a pack of 8 consecutive elements of one row
// (16-byte loads/stores when the row length is a multiple of 8 and pointers are aligned);
// blockIdx.y strides over rows. Mask bits come from loom_ops/philox.h, the code the CPU
// kernels run, at the global indices of the ElementLayout.
#include "cuda/common.cuh"
#include "loom_ops/philox.h"

namespace loom::ops::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ void load_bias(const float* bias, int64_t col, int n, bool vector,
                                          float out[kPack]) {
  if (vector && n == kPack) {
    const float4* b4 = reinterpret_cast<const float4*>(bias + col);
    *reinterpret_cast<float4*>(out) = b4[0];
    *reinterpret_cast<float4*>(out + 4) = b4[1];
    return;
  }
#pragma unroll
  for (int e = 0; e < kPack; ++e) out[e] = e < n ? bias[col + e] : 0.0f;
}

template <typename T>
__global__ void dropout_kernel(const T* __restrict__ x, const float* __restrict__ bias,
                               const T* __restrict__ residual, T* __restrict__ out,
                               const __grid_constant__ ElementLayout layout, uint64_t seed, uint64_t sid,
                               uint64_t threshold, float scale, int64_t rows, bool vector) {
  const int64_t cols = layout.row_length();
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t col = p * kPack;
  if (col >= cols) return;
  const int n = pack_len(cols, col);
  float b[kPack];
  if (bias) load_bias(bias, col, n, vector, b);
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const int64_t off = row * cols + col;
    const uint32_t bits = dropout_keep_bits8(seed, sid, static_cast<uint64_t>(layout.row_start(row) + col),
                                     threshold);
    float v[kPack], r[kPack];
    load_partial<T>(x + off, n, vector, v);
    if (residual) load_partial<T>(residual + off, n, vector, r);
#pragma unroll
    for (int e = 0; e < kPack; ++e) {
      float u = bias ? v[e] + b[e] : v[e];
      u = (bits >> e) & 1u ? u * scale : 0.0f;
      v[e] = residual ? u + r[e] : u;
    }
    store_partial<T>(out + off, n, vector, v);
  }
}

__global__ void dropout_mask_kernel(bool* __restrict__ out, const __grid_constant__ ElementLayout layout, uint64_t seed,
                                    uint64_t sid, uint64_t threshold, int64_t rows) {
  const int64_t cols = layout.row_length();
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kPack;
  if (col >= cols) return;
  const int n = pack_len(cols, col);
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const uint32_t bits = dropout_keep_bits8(seed, sid, static_cast<uint64_t>(layout.row_start(row) + col),
                                     threshold);
    bool* o = out + row * cols + col;
    for (int e = 0; e < n; ++e) o[e] = (bits >> e) & 1u;
  }
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

template <typename T>
__global__ void bias_gelu_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                 const float* __restrict__ bias, T* __restrict__ out,
                                 int64_t rows, int64_t cols, bool vector) {
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kPack;
  if (col >= cols) return;
  const int n = pack_len(cols, col);
  float b[kPack];
  load_bias(bias, col, n, vector, b);
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const int64_t off = row * cols + col;
    float v[kPack], g[kPack];
    load_partial<T>(x + off, n, vector, v);
    if (dy) load_partial<T>(dy + off, n, vector, g);
#pragma unroll
    for (int e = 0; e < kPack; ++e) {
      const float u = v[e] + b[e];
      const float t = tanhf(kSqrt2OverPi * (u + kGeluCubic * u * u * u));
      if (dy) {
        const float d = 0.5f * (1.0f + t) +
                        0.5f * u * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * u * u);
        v[e] = g[e] * d;
      } else {
        v[e] = 0.5f * u * (1.0f + t);
      }
    }
    store_partial<T>(out + off, n, vector, v);
  }
}

/// Threads per block: one per pack of a row, at most kThreads.
int threads_for(int64_t cols) {
  const int64_t packs = (cols + kPack - 1) / kPack;
  const int t = round_up_warp(packs);
  return t < kThreads ? t : kThreads;
}

/// x: the packs of a row; y: rows (striding past 65535).
dim3 grid_for(int64_t rows, int64_t cols, int threads) {
  const int64_t packs = (cols + kPack - 1) / kPack;
  return dim3(static_cast<unsigned>((packs + threads - 1) / threads),
              static_cast<unsigned>(rows < 65535 ? rows : 65535));
}

int64_t rows_of(const ElementLayout& layout) {
  int64_t rows = 1;
  for (int d = 0; d + 1 < layout.ndim; ++d) rows *= layout.sizes[d];
  return rows;
}

}  // namespace

void dropout_forward(DType t, const void* x, const float* bias, const void* residual,
                     void* out, const ElementLayout& layout, uint64_t seed, uint64_t stream_id,
                     uint64_t threshold, float scale, cudaStream_t stream) {
  const int64_t rows = rows_of(layout), cols = layout.row_length();
  if (rows == 0 || cols == 0) return;
  const bool vector = cols % kPack == 0 && aligned16(x) && aligned16(out) &&
                      (!bias || aligned16(bias)) && (!residual || aligned16(residual));
  const int threads = threads_for(cols);
  const dim3 grid = grid_for(rows, cols, threads);
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    LOOM_LAUNCH(dropout_kernel<T>, grid, threads, 0, stream)(
        static_cast<const T*>(x), bias, static_cast<const T*>(residual), static_cast<T*>(out),
        layout, seed, stream_id, threshold, scale, rows, vector);
  });
  check_launch("dropout");
}

void dropout_mask(bool* out, const ElementLayout& layout, uint64_t seed, uint64_t stream_id,
                  uint64_t threshold, cudaStream_t stream) {
  const int64_t rows = rows_of(layout), cols = layout.row_length();
  if (rows == 0 || cols == 0) return;
  const int threads = threads_for(cols);
  const dim3 grid = grid_for(rows, cols, threads);
  LOOM_LAUNCH(dropout_mask_kernel, grid, threads, 0, stream)(out, layout, seed, stream_id,
                                                             threshold, rows);
  check_launch("dropout_mask");
}

void bias_gelu_forward(DType t, const void* x, const float* bias, void* y, int64_t rows,
                       int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const bool vector = cols % kPack == 0 && aligned16(x) && aligned16(y) && aligned16(bias);
  const int threads = threads_for(cols);
  const dim3 grid = grid_for(rows, cols, threads);
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    LOOM_LAUNCH(bias_gelu_kernel<T>, grid, threads, 0, stream)(
        nullptr, static_cast<const T*>(x), bias, static_cast<T*>(y), rows, cols, vector);
  });
  check_launch("bias_gelu_forward");
}

void bias_gelu_backward(DType t, const void* dy, const void* x, const float* bias, void* dx,
                        int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const bool vector = cols % kPack == 0 && aligned16(x) && aligned16(dy) && aligned16(dx) &&
                      aligned16(bias);
  const int threads = threads_for(cols);
  const dim3 grid = grid_for(rows, cols, threads);
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    LOOM_LAUNCH(bias_gelu_kernel<T>, grid, threads, 0, stream)(
        static_cast<const T*>(dy), static_cast<const T*>(x), bias, static_cast<T*>(dx), rows,
        cols, vector);
  });
  check_launch("bias_gelu_backward");
}

}  // namespace loom::ops::cuda
