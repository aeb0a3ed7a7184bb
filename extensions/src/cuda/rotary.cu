// Rotate-half RoPE CUDA kernel (loom_ops/ops.h `rotary`; the CPU kernel, cpu/rotary_cpu.cpp,
// has the formulas). blockIdx.y strides over rows (b, head, s); each thread of a row handles one
// pair (i, i + r/2) or one pass-through dimension j >= r. Element loads (a row of Q or K is a
// strided view into the QKV projection; d is small), coalesced along the row.
#include "cuda/common.cuh"

namespace loom::ops::cuda {
namespace {

constexpr int kThreads = 128;

template <typename T>
__global__ void rotary_kernel(const T* __restrict__ x, int64_t sb, int64_t sh, int64_t ss,
                              const T* __restrict__ cos, const T* __restrict__ sin,
                              T* __restrict__ out, int64_t H, int64_t S, int64_t d, int64_t r,
                              int64_t table_batch_stride, int64_t rows, bool backward) {
  const int64_t half = r / 2;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // work item
  if (j >= half + (d - r)) return;
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const int64_t b = row / (H * S), h = (row / S) % H, s = row % S;
    const T* xr = x + b * sb + h * sh + s * ss;
    T* o = out + row * d;
    if (j >= half) {  // pass-through dimension
      const int64_t col = r + (j - half);
      o[col] = xr[col];
      continue;
    }
    const T* c = cos + b * table_batch_stride + s * r;
    const T* sn = sin + b * table_batch_stride + s * r;
    const float x1 = to_float<T>(xr[j]), x2 = to_float<T>(xr[j + half]);
    const float c1 = to_float<T>(c[j]), c2 = to_float<T>(c[j + half]);
    const float s1 = to_float<T>(sn[j]), s2 = to_float<T>(sn[j + half]);
    if (backward) {  // the transpose of the forward rotation
      o[j] = from_float<T>(x1 * c1 + x2 * s2);
      o[j + half] = from_float<T>(x2 * c2 - x1 * s1);
    } else {
      o[j] = from_float<T>(x1 * c1 - x2 * s1);
      o[j + half] = from_float<T>(x2 * c2 + x1 * s2);
    }
  }
}

}  // namespace

void rotary(DType t, const void* x, int64_t sb, int64_t sh, int64_t ss, const void* cos,
            const void* sin, void* out, int64_t B, int64_t H, int64_t S, int64_t d, int64_t r,
            int64_t table_batches, bool backward, cudaStream_t stream) {
  const int64_t rows = B * H * S, items = r / 2 + (d - r);
  if (rows == 0 || d == 0) return;
  const int threads = round_up_warp(items < kThreads ? items : kThreads);
  const dim3 grid(static_cast<unsigned>((items + threads - 1) / threads),
                  static_cast<unsigned>(rows < 65535 ? rows : 65535));
  const int64_t table_batch_stride = table_batches == 1 ? 0 : S * r;
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    LOOM_LAUNCH(rotary_kernel<T>, grid, threads, 0, stream)(
        static_cast<const T*>(x), sb, sh, ss, static_cast<const T*>(cos),
        static_cast<const T*>(sin), static_cast<T*>(out), H, S, d, r, table_batch_stride, rows,
        backward);
  });
  check_launch(backward ? "rotary_backward" : "rotary");
}

}  // namespace loom::ops::cuda
