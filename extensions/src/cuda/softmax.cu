// Scaled masked softmax CUDA kernels: one block per row (grid-stride over rows), the row
// held in registers (kCache packs of 8 per thread) across the max / sum / write passes, so
// x is read from memory once for rows up to 256 * 8 * kCache = 4096 keys. Masked entries
// (explicit mask, causal, or past the row end) are -inf before the max, hence probability
// 0; a fully masked row is written as zeros (same rule as the CPU kernel).
#include "cuda/common.cuh"

namespace loom::ops::cuda {
namespace {

constexpr int kCache = 2;
constexpr int kMaxThreads = 256;

int threads_for(int64_t sk) {
  const int64_t packs = (sk + kPack - 1) / kPack;
  const int t = round_up_warp((packs + kCache - 1) / kCache);
  return t < 32 ? 32 : (t > kMaxThreads ? kMaxThreads : t);
}

unsigned blocks_for(int64_t rows) {
  return static_cast<unsigned>(rows < (1 << 20) ? rows : (1 << 20));
}

template <typename T>
__global__ void __launch_bounds__(kMaxThreads)
    softmax_forward_kernel(const T* __restrict__ x, const bool* __restrict__ mask,
                           const int64_t* __restrict__ mask_rows, T* __restrict__ y,
                           int64_t rows, int64_t sq, int64_t sk, float scale, bool causal,
                           bool vector) {
  __shared__ float scratch[32];
  const int64_t packs = (sk + kPack - 1) / kPack;
  const int64_t stride = blockDim.x;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * sk;
    T* yr = y + row * sk;
    const bool* mr = mask ? mask + mask_rows[row] : nullptr;
    const int64_t q = row % sq;
    const int64_t limit = causal ? min(sk, q + (sk - sq) + 1) : sk;
    auto load = [&](int64_t p, float v[kPack]) {
      const int n = pack_len(sk, p * kPack);
      load_partial<T>(xr + p * kPack, n, vector, v);
#pragma unroll
      for (int e = 0; e < kPack; ++e) {
        const int64_t col = p * kPack + e;
        const bool masked = e >= n || col >= limit || (mr && mr[col]);
        v[e] = masked ? -INFINITY : v[e] * scale;
      }
    };
    float cache[kCache][kPack];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < kCache; ++i) {
      const int64_t p = threadIdx.x + i * stride;
      if (p < packs) {
        load(p, cache[i]);
#pragma unroll
        for (int e = 0; e < kPack; ++e) mx = fmaxf(mx, cache[i][e]);
      }
    }
    for (int64_t p = threadIdx.x + kCache * stride; p < packs; p += stride) {
      float v[kPack];
      load(p, v);
#pragma unroll
      for (int e = 0; e < kPack; ++e) mx = fmaxf(mx, v[e]);
    }
    mx = block_max(mx, scratch);
    const bool all_masked = mx == -INFINITY;
    float sum = 0.0f;
    if (!all_masked) {
#pragma unroll
      for (int i = 0; i < kCache; ++i) {
        const int64_t p = threadIdx.x + i * stride;
        if (p < packs) {
#pragma unroll
          for (int e = 0; e < kPack; ++e) {
            cache[i][e] = expf(cache[i][e] - mx);
            sum += cache[i][e];
          }
        }
      }
      for (int64_t p = threadIdx.x + kCache * stride; p < packs; p += stride) {
        float v[kPack];
        load(p, v);
#pragma unroll
        for (int e = 0; e < kPack; ++e) sum += expf(v[e] - mx);
      }
    }
    sum = block_sum(sum, scratch);
    const float inv = all_masked ? 0.0f : 1.0f / sum;
    auto write = [&](int64_t p, float v[kPack], bool exponentiated) {
      const int n = pack_len(sk, p * kPack);
#pragma unroll
      for (int e = 0; e < kPack; ++e)
        v[e] = all_masked ? 0.0f : (exponentiated ? v[e] : expf(v[e] - mx)) * inv;
      store_partial<T>(yr + p * kPack, n, vector, v);
    };
#pragma unroll
    for (int i = 0; i < kCache; ++i) {
      const int64_t p = threadIdx.x + i * stride;
      if (p < packs) write(p, cache[i], true);
    }
    for (int64_t p = threadIdx.x + kCache * stride; p < packs; p += stride) {
      float v[kPack];
      load(p, v);
      write(p, v, false);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kMaxThreads)
    softmax_backward_kernel(const T* __restrict__ dy, const T* __restrict__ y,
                            T* __restrict__ dx, int64_t rows, int64_t sk, float scale,
                            bool vector) {
  __shared__ float scratch[32];
  const int64_t packs = (sk + kPack - 1) / kPack;
  const int64_t stride = blockDim.x;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* dyr = dy + row * sk;
    const T* yr = y + row * sk;
    float cy[kCache][kPack], cg[kCache][kPack];
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kCache; ++i) {
      const int64_t p = threadIdx.x + i * stride;
      if (p < packs) {
        const int n = pack_len(sk, p * kPack);
        load_partial<T>(yr + p * kPack, n, vector, cy[i]);
        load_partial<T>(dyr + p * kPack, n, vector, cg[i]);
#pragma unroll
        for (int e = 0; e < kPack; ++e) dot += cy[i][e] * cg[i][e];
      }
    }
    for (int64_t p = threadIdx.x + kCache * stride; p < packs; p += stride) {
      const int n = pack_len(sk, p * kPack);
      float a[kPack], b[kPack];
      load_partial<T>(yr + p * kPack, n, vector, a);
      load_partial<T>(dyr + p * kPack, n, vector, b);
#pragma unroll
      for (int e = 0; e < kPack; ++e) dot += a[e] * b[e];
    }
    dot = block_sum(dot, scratch);
    auto write = [&](int64_t p, const float a[kPack], const float b[kPack]) {
      const int n = pack_len(sk, p * kPack);
      float out[kPack];
#pragma unroll
      for (int e = 0; e < kPack; ++e) out[e] = scale * a[e] * (b[e] - dot);
      store_partial<T>(dx + row * sk + p * kPack, n, vector, out);
    };
#pragma unroll
    for (int i = 0; i < kCache; ++i) {
      const int64_t p = threadIdx.x + i * stride;
      if (p < packs) write(p, cy[i], cg[i]);
    }
    for (int64_t p = threadIdx.x + kCache * stride; p < packs; p += stride) {
      const int n = pack_len(sk, p * kPack);
      float a[kPack], b[kPack];
      load_partial<T>(yr + p * kPack, n, vector, a);
      load_partial<T>(dyr + p * kPack, n, vector, b);
      write(p, a, b);
    }
  }
}

}  // namespace

void softmax_forward(DType t, const void* x, const bool* mask, const int64_t* mask_rows,
                     void* y, int64_t rows, int64_t sq, int64_t sk, float scale, bool causal,
                     cudaStream_t stream) {
  if (rows == 0 || sk == 0) return;
  const bool vector = sk % kPack == 0 && aligned16(x) && aligned16(y);
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    LOOM_LAUNCH(softmax_forward_kernel<T>, blocks_for(rows), threads_for(sk), 0, stream)(
        static_cast<const T*>(x), mask, mask_rows, static_cast<T*>(y), rows, sq, sk, scale,
        causal, vector);
  });
  check_launch("scaled_masked_softmax_forward");
}

void softmax_backward(DType t, const void* dy, const void* y, void* dx, int64_t rows,
                      int64_t sk, float scale, cudaStream_t stream) {
  if (rows == 0 || sk == 0) return;
  const bool vector = sk % kPack == 0 && aligned16(dy) && aligned16(y) && aligned16(dx);
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    LOOM_LAUNCH(softmax_backward_kernel<T>, blocks_for(rows), threads_for(sk), 0, stream)(
        static_cast<const T*>(dy), static_cast<const T*>(y), static_cast<T*>(dx), rows, sk,
        scale, vector);
  });
  check_launch("scaled_masked_softmax_backward");
}

}  // namespace loom::ops::cuda
