// SwiGLU CUDA kernels on Loom's interleaved (gate, up) pairs (loom_ops/ops.h `swiglu`; the
// formulas are in cpu/swiglu_cpu.cpp). Grid-stride over pairs; a pair is two adjacent
// elements, so a warp reads 64 consecutive inputs (coalesced) and writes 32 outputs.
#include "cuda/common.cuh"

namespace loom::ops::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float sigmoidf(float g) { return 1.0f / (1.0f + expf(-g)); }

/// dy null: forward (out[i] = silu(g) u); else backward (out[2i], out[2i + 1] = dg, du).
template <typename T>
__global__ void swiglu_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                              T* __restrict__ out, int64_t pairs) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < pairs;
       i += step) {
    const float g = to_float<T>(x[2 * i]), u = to_float<T>(x[2 * i + 1]);
    const float sg = sigmoidf(g);
    if (dy) {
      const float d = to_float<T>(dy[i]);
      out[2 * i] = from_float<T>(d * u * sg * (1.0f + g * (1.0f - sg)));
      out[2 * i + 1] = from_float<T>(d * g * sg);
    } else {
      out[i] = from_float<T>(g * sg * u);
    }
  }
}

void launch(DType t, const void* dy, const void* x, void* out, int64_t pairs, cudaStream_t stream,
            const char* name) {
  if (pairs == 0) return;
  const int64_t want = (pairs + kThreads - 1) / kThreads, cap = 32 * static_cast<int64_t>(sm_count());
  const unsigned blocks = static_cast<unsigned>(want < cap ? want : cap);
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    LOOM_LAUNCH(swiglu_kernel<T>, blocks, kThreads, 0, stream)(
        static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<T*>(out), pairs);
  });
  check_launch(name);
}

}  // namespace

void swiglu_forward(DType t, const void* x, void* y, int64_t pairs, cudaStream_t stream) {
  launch(t, nullptr, x, y, pairs, stream, "swiglu_forward");
}

void swiglu_backward(DType t, const void* dy, const void* x, void* dx, int64_t pairs,
                     cudaStream_t stream) {
  launch(t, dy, x, dx, pairs, stream, "swiglu_backward");
}

}  // namespace loom::ops::cuda
