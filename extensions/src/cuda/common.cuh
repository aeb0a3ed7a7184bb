// Device helpers shared by the loom CUDA kernels: fp32 conversion, 8-element packs moved
// with 16-byte loads/stores, warp and block sums/maxima, launch checks.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/launchers.h"

// A kernel launch and a dynamic shared-memory declaration, spelled as macros: under nvcc they
// are exactly `kernel<<<grid, block, smem, stream>>>(args...)` and `extern __shared__ T name[]`;
// under a host compiler they go to the test-only CUDA simulator (tests/cuda_sim,
// docs/design/cuda_sim.md), which compiles these sources as C++ and runs the kernels on a CPU.
#if defined(__CUDACC__)
#define LOOM_LAUNCH(kernel, grid, block, smem, stream) kernel<<<grid, block, smem, stream>>>
#define LOOM_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#else
#define LOOM_LAUNCH(kernel, grid, block, smem, stream) \
  CUDA_SIM_LAUNCH(kernel, grid, block, smem, stream)
#define LOOM_DYNAMIC_SHARED(T, name) CUDA_SIM_DYNAMIC_SHARED(T, name)
#endif

namespace loom::ops::cuda {

template <typename T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <> __device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}

/// Elements per pack: 8 (16 bytes of bf16/fp16, two 16-byte words of fp32).
constexpr int kPack = 8;

/// Loads 8 elements at p (16-byte aligned) as floats with 16-byte loads.
template <typename T>
__device__ __forceinline__ void load_pack(const T* p, float out[kPack]) {
  constexpr int kWords = kPack * sizeof(T) / 16;
  uint4 raw[kWords];
#pragma unroll
  for (int i = 0; i < kWords; ++i) raw[i] = reinterpret_cast<const uint4*>(p)[i];
  const T* e = reinterpret_cast<const T*>(raw);
#pragma unroll
  for (int i = 0; i < kPack; ++i) out[i] = to_float<T>(e[i]);
}

/// Stores 8 floats at p (16-byte aligned) as T with 16-byte stores.
template <typename T>
__device__ __forceinline__ void store_pack(T* p, const float in[kPack]) {
  constexpr int kWords = kPack * sizeof(T) / 16;
  uint4 raw[kWords];
  T* e = reinterpret_cast<T*>(raw);
#pragma unroll
  for (int i = 0; i < kPack; ++i) e[i] = from_float<T>(in[i]);
#pragma unroll
  for (int i = 0; i < kWords; ++i) reinterpret_cast<uint4*>(p)[i] = raw[i];
}

/// Elements of the pack starting at `start` in a row of `total`: min(8, total - start).
__device__ __forceinline__ int pack_len(int64_t total, int64_t start) {
  const int64_t n = total - start;
  return n < kPack ? static_cast<int>(n) : kPack;
}

/// Loads up to 8 elements (n < 8 or unaligned: element by element; missing ones are 0).
template <typename T>
__device__ __forceinline__ void load_partial(const T* p, int n, bool vector, float out[kPack]) {
  if (vector && n == kPack) {
    load_pack<T>(p, out);
    return;
  }
#pragma unroll
  for (int i = 0; i < kPack; ++i) out[i] = i < n ? to_float<T>(p[i]) : 0.0f;
}

template <typename T>
__device__ __forceinline__ void store_partial(T* p, int n, bool vector, const float in[kPack]) {
  if (vector && n == kPack) {
    store_pack<T>(p, in);
    return;
  }
#pragma unroll
  for (int i = 0; i < kPack; ++i)
    if (i < n) p[i] = from_float<T>(in[i]);
}

/// 8 elements kept in their storage type (4 registers for bf16/fp16), for caching a row in
/// registers at half the cost of floats.
template <typename T>
struct alignas(16) Pack {
  T e[kPack];
};

/// Loads the pack at p (n valid elements, the rest 0) with 16-byte loads when allowed.
template <typename T>
__device__ __forceinline__ Pack<T> load_raw(const T* p, int n, bool vector) {
  Pack<T> out;
  if (vector && n == kPack) {
    constexpr int kWords = kPack * sizeof(T) / 16;
#pragma unroll
    for (int i = 0; i < kWords; ++i)
      reinterpret_cast<uint4*>(&out)[i] = reinterpret_cast<const uint4*>(p)[i];
    return out;
  }
#pragma unroll
  for (int i = 0; i < kPack; ++i) out.e[i] = i < n ? p[i] : from_float<T>(0.0f);
  return out;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Two sums over the block at once (one pair of barriers); every thread gets both.
__device__ __forceinline__ float2 block_sum2(float a, float b, float* scratch /* 64 floats */) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  a = warp_sum(a);
  b = warp_sum(b);
  __syncthreads();
  if (lane == 0) {
    scratch[warp] = a;
    scratch[32 + warp] = b;
  }
  __syncthreads();
  a = lane < warps ? scratch[lane] : 0.0f;
  b = lane < warps ? scratch[32 + lane] : 0.0f;
  return make_float2(warp_sum(a), warp_sum(b));
}

/// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
/// `scratch` is 32 floats of shared memory, reusable after the call returns.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline int round_up_warp(int64_t n) {
  return static_cast<int>(((n + 31) / 32) * 32);
}

inline void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("loom_ops CUDA kernel ") + kernel +
                             " failed to launch: " + cudaGetErrorString(err));
}

inline int sm_count() {
  int device = 0, count = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
  return count > 0 ? count : 1;
}

/// Runs f.template operator()<T>() for the element type t.
template <typename F>
void dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kFloat: f(float{}); break;
    case DType::kBFloat16: f(__nv_bfloat16{}); break;
    case DType::kHalf: f(__half{}); break;
  }
}

}  // namespace loom::ops::cuda
