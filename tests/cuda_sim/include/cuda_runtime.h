// Test-only stand-in for the CUDA runtime header: with tests/cuda_sim/include first on the
// include path, g++ compiles extensions/src/cuda/*.cu as C++ (-x c++ -fno-strict-aliasing)
// and every kernel launch runs on the CPU in the CUDA execution-model simulator
// (cuda_sim.h; docs/design/cuda_sim.md). The toolkit's own vector_types.h, cuda_fp16.h,
// cuda_bf16.h and cuda_runtime_api.h (types, enums, runtime API declarations) are used as
// they are; the simulator defines the runtime functions the kernels and tests call.
// Never part of loom or libloom_ops.so.
#pragma once

#if defined(__CUDACC__)
#error "tests/cuda_sim/include/cuda_runtime.h stands in for CUDA under a host compiler only"
#endif

#include <cuda_runtime_api.h>
#include <driver_types.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda_sim/cuda_sim.h"

// Execution-space keywords: plain C++. Static __shared__ variables become function-local
// statics (blocks run one at a time, so a static is exactly "per block") in one linker
// section, which the simulator fills with NaN bytes at each block's start. Under
// AddressSanitizer they stay out of that section instead: ASan gives no redzones to variables
// in a named section, so there static shared arrays are bounds-checked rather than NaN-filled.
#undef __host__
#undef __device__
#undef __global__
#undef __shared__
#undef __grid_constant__
#undef __launch_bounds__
#undef __forceinline__
#define __host__
#define __device__
#define __global__
#define __grid_constant__
#define __launch_bounds__(...)
#define __forceinline__ inline
#if defined(__SANITIZE_ADDRESS__)
#define __shared__ static __attribute__((aligned(16)))
#else
#define __shared__ static __attribute__((section("cuda_sim_shared"), aligned(16)))
#endif

// The kernels' launch and dynamic shared memory (common.cuh's LOOM_LAUNCH and
// LOOM_DYNAMIC_SHARED expand to these under a host compiler).
#define CUDA_SIM_LAUNCH(kernel, grid, block, smem, stream) \
  ::cuda_sim::make_launch(kernel, #kernel, grid, block, smem, stream)
#define CUDA_SIM_DYNAMIC_SHARED(T, name) \
  T* const name = static_cast<T*>(::cuda_sim::dynamic_shared())

// ---- built-in variables ------------------------------------------------------------------
// Set by the scheduler before it resumes a thread (one thread runs at a time).
extern uint3 threadIdx;
extern uint3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;
constexpr int warpSize = 32;

// ---- synchronisation and warp intrinsics ---------------------------------------------------
#define __syncthreads() ::cuda_sim::syncthreads(__FILE__, __LINE__)

inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::cuda_sim::warp_op(::cuda_sim::WarpOpKind::kSyncWarp, mask, 0, 0, 32);
}

namespace cuda_sim::detail {
template <typename T>
T shuffle(WarpOpKind kind, unsigned mask, T var, int arg, int width) {
  static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8,
                "cuda_sim: shuffles move values of at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &var, sizeof(T));
  bits = warp_op(kind, mask, bits, arg, width);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}
}  // namespace cuda_sim::detail

template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {
  return ::cuda_sim::detail::shuffle(::cuda_sim::WarpOpKind::kShflIdx, mask, var, src_lane, width);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  return ::cuda_sim::detail::shuffle(::cuda_sim::WarpOpKind::kShflUp, mask, var,
                                     static_cast<int>(delta), width);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  return ::cuda_sim::detail::shuffle(::cuda_sim::WarpOpKind::kShflDown, mask, var,
                                     static_cast<int>(delta), width);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
  return ::cuda_sim::detail::shuffle(::cuda_sim::WarpOpKind::kShflXor, mask, var, lane_mask, width);
}

// ---- device math the kernels use that the host library lacks -------------------------------
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }

// ---- runtime API ----------------------------------------------------------------------------
// The simulator's runtime functions live in cuda_sim::api and the names are macros for them,
// so they never interpose on the real libcudart that LibTorch loads in the same process.
namespace cuda_sim::api {
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorName(cudaError_t error);
const char* cudaGetErrorString(cudaError_t error);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value);
template <typename T>
cudaError_t cudaFuncSetAttribute(T* func, cudaFuncAttribute attr, int value) {
  return ::cuda_sim::api::cudaFuncSetAttribute(reinterpret_cast<const void*>(func), attr, value);
}
cudaError_t cudaMalloc(void** ptr, size_t size);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind);
cudaError_t cudaMemset(void* ptr, int value, size_t count);
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream = nullptr);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
}  // namespace cuda_sim::api

#define cudaGetLastError ::cuda_sim::api::cudaGetLastError
#define cudaPeekAtLastError ::cuda_sim::api::cudaPeekAtLastError
#define cudaGetErrorName ::cuda_sim::api::cudaGetErrorName
#define cudaGetErrorString ::cuda_sim::api::cudaGetErrorString
#define cudaGetDevice ::cuda_sim::api::cudaGetDevice
#define cudaGetDeviceCount ::cuda_sim::api::cudaGetDeviceCount
#define cudaDeviceGetAttribute ::cuda_sim::api::cudaDeviceGetAttribute
#define cudaFuncSetAttribute ::cuda_sim::api::cudaFuncSetAttribute
#define cudaMalloc ::cuda_sim::api::cudaMalloc
#define cudaFree ::cuda_sim::api::cudaFree
#define cudaMemcpy ::cuda_sim::api::cudaMemcpy
#define cudaMemset ::cuda_sim::api::cudaMemset
#define cudaMemsetAsync ::cuda_sim::api::cudaMemsetAsync
#define cudaDeviceSynchronize ::cuda_sim::api::cudaDeviceSynchronize
#define cudaStreamSynchronize ::cuda_sim::api::cudaStreamSynchronize
