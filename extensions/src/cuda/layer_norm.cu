// LayerNorm and RMSNorm forward/backward CUDA kernels (fp32 statistics and accumulation).
// RMSNorm is LayerNorm with mean 0, no beta and no mean(g) term: each kernel takes kRms and
// skips those parts (mean, beta and dbeta pointers are null then).
//
// Forward: one block per row. Each thread caches its packs of 8 elements in registers in
// the storage type (up to kCache packs, i.e. rows up to 512 * 8 * 4 = 16384 elements), so
// x is read from memory once for the two-pass mean/variance and the output; longer rows
// re-read the tail (from L1/L2).
//
// Backward, rows up to 1024 * 8 * 2 = 16384 elements (fused): blocks stride over rows; per row a thread
// caches its packs of x and dy in registers, the block reduces sum(g) and sum(g * xhat)
// (g = dy * gamma), the thread writes dx and adds dy * xhat and dy for its own columns to
// dgamma/dbeta partial sums kept in shared memory (no atomics: a thread owns its columns).
// Each block then writes its partial row to a workspace and a small kernel sums the
// partial rows, so x and dy are read once and dgamma/dbeta cost ~2 * blocks * cols floats.
// Longer rows: a dx kernel re-reading the row, then a column kernel for the partials.
#include "cuda/common.cuh"

namespace loom::ops::cuda {
namespace {

constexpr int kCache = 4;         // forward: packs of 8 cached per thread
constexpr int kMaxThreads = 512;
constexpr int kCacheBwd = 2;      // fused backward: packs of x and of dy per thread
constexpr int kMaxThreadsBwd = 1024;

int threads_for(int64_t packs, int cache = kCache, int max_threads = kMaxThreads) {
  const int64_t t = round_up_warp((packs + cache - 1) / cache);
  return static_cast<int>(t < 32 ? 32 : (t > max_threads ? max_threads : t));
}

__device__ __forceinline__ void load_floats(const float* p, int n, bool vector, float out[kPack]) {
  if (vector && n == kPack) {
    *reinterpret_cast<float4*>(out) = reinterpret_cast<const float4*>(p)[0];
    *reinterpret_cast<float4*>(out + 4) = reinterpret_cast<const float4*>(p)[1];
    return;
  }
#pragma unroll
  for (int e = 0; e < kPack; ++e) out[e] = e < n ? p[e] : 0.0f;
}

template <typename T, bool kRms>
__global__ void __launch_bounds__(kMaxThreads)
    ln_forward_kernel(const T* __restrict__ x, const float* __restrict__ gamma,
                      const float* __restrict__ beta, T* __restrict__ y,
                      float* __restrict__ mean_out, float* __restrict__ rstd_out, int64_t cols,
                      float eps, bool vector) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * cols;
  T* yr = y + row * cols;
  const int64_t packs = (cols + kPack - 1) / kPack;
  const int64_t stride = blockDim.x;
  Pack<T> cache[kCache];

  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kCache; ++i) {
    const int64_t p = threadIdx.x + i * stride;
    if (p < packs) cache[i] = load_raw<T>(xr + p * kPack, pack_len(cols, p * kPack), vector);
  }
#pragma unroll
  for (int i = 0; i < kCache; ++i) {
    const int64_t p = threadIdx.x + i * stride;
    if (p < packs) {
#pragma unroll
      for (int e = 0; e < kPack; ++e) sum += to_float<T>(cache[i].e[e]);  // missing are 0
    }
  }
  for (int64_t p = threadIdx.x + kCache * stride; p < packs; p += stride) {
    const Pack<T> v = load_raw<T>(xr + p * kPack, pack_len(cols, p * kPack), vector);
#pragma unroll
    for (int e = 0; e < kPack; ++e) sum += to_float<T>(v.e[e]);
  }
  const float mu = kRms ? 0.0f : block_sum(sum, scratch) / static_cast<float>(cols);

  float sq = 0.0f;
  auto add_sq = [&](const Pack<T>& v, int n) {
#pragma unroll
    for (int e = 0; e < kPack; ++e) {
      const float d = e < n ? to_float<T>(v.e[e]) - mu : 0.0f;
      sq += d * d;
    }
  };
#pragma unroll
  for (int i = 0; i < kCache; ++i) {
    const int64_t p = threadIdx.x + i * stride;
    if (p < packs) add_sq(cache[i], pack_len(cols, p * kPack));
  }
  for (int64_t p = threadIdx.x + kCache * stride; p < packs; p += stride) {
    const int n = pack_len(cols, p * kPack);
    add_sq(load_raw<T>(xr + p * kPack, n, vector), n);
  }
  const float rs = rsqrtf(block_sum(sq, scratch) / static_cast<float>(cols) + eps);

  auto write = [&](int64_t p, const Pack<T>& v) {
    const int n = pack_len(cols, p * kPack);
    float g[kPack], b[kPack] = {}, out[kPack];
    load_floats(gamma + p * kPack, n, vector, g);
    if (!kRms) load_floats(beta + p * kPack, n, vector, b);
#pragma unroll
    for (int e = 0; e < kPack; ++e) out[e] = (to_float<T>(v.e[e]) - mu) * rs * g[e] + b[e];
    store_partial<T>(yr + p * kPack, n, vector, out);
  };
#pragma unroll
  for (int i = 0; i < kCache; ++i) {
    const int64_t p = threadIdx.x + i * stride;
    if (p < packs) write(p, cache[i]);
  }
  for (int64_t p = threadIdx.x + kCache * stride; p < packs; p += stride)
    write(p, load_raw<T>(xr + p * kPack, pack_len(cols, p * kPack), vector));
  if (threadIdx.x == 0) {
    if (!kRms) mean_out[row] = mu;
    rstd_out[row] = rs;
  }
}

/// Fused backward (packs <= kCacheBwd * blockDim.x): dx for rows blockIdx.x + k * gridDim.x and
/// this block's dgamma/dbeta partial sums, written to partial[blockIdx.x][0..cols) and
/// partial[gridDim.x + blockIdx.x][0..cols). Dynamic shared memory: 2 * cols floats.
template <typename T, bool kRms>
__global__ void __launch_bounds__(kMaxThreadsBwd)
    ln_backward_fused_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                             const float* __restrict__ mean, const float* __restrict__ rstd,
                             const float* __restrict__ gamma, T* __restrict__ dx,
                             float* __restrict__ partial, int64_t rows, int64_t cols,
                             bool vector) {
  LOOM_DYNAMIC_SHARED(float, acc);  // [0, cols): dgamma partials, [cols, 2 cols): dbeta
  __shared__ float scratch[64];
  const int64_t packs = (cols + kPack - 1) / kPack;
  const int64_t stride = blockDim.x;
  // Only the row's columns: acc holds exactly 2 * cols floats, so the last pack's pad past
  // cols must not be written (it would run past the end of the dynamic shared memory).
#pragma unroll
  for (int i = 0; i < kCacheBwd; ++i) {
    const int64_t p = threadIdx.x + i * stride;
    if (p < packs) {
      const int n = pack_len(cols, p * kPack);
      for (int e = 0; e < n; ++e) acc[p * kPack + e] = acc[cols + p * kPack + e] = 0.0f;
    }
  }
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * cols;
    const T* dyr = dy + row * cols;
    const float mu = kRms ? 0.0f : mean[row], rs = rstd[row];
    Pack<T> xc[kCacheBwd], dc[kCacheBwd];
#pragma unroll
    for (int i = 0; i < kCacheBwd; ++i) {
      const int64_t p = threadIdx.x + i * stride;
      if (p < packs) {
        const int n = pack_len(cols, p * kPack);
        xc[i] = load_raw<T>(xr + p * kPack, n, vector);
        dc[i] = load_raw<T>(dyr + p * kPack, n, vector);
      }
    }
    float s_g = 0.0f, s_gx = 0.0f;  // sum g, sum g * xhat
#pragma unroll
    for (int i = 0; i < kCacheBwd; ++i) {
      const int64_t p = threadIdx.x + i * stride;
      if (p < packs) {
        float g[kPack];
        load_floats(gamma + p * kPack, pack_len(cols, p * kPack), vector, g);
#pragma unroll
        for (int e = 0; e < kPack; ++e) {
          const float gv = to_float<T>(dc[i].e[e]) * g[e];  // 0 past the row end
          s_g += gv;
          s_gx += gv * (to_float<T>(xc[i].e[e]) - mu) * rs;
        }
      }
    }
    const float2 sums = block_sum2(s_g, s_gx, scratch);
    const float mean_g = kRms ? 0.0f : sums.x / static_cast<float>(cols);
    const float mean_gx = sums.y / static_cast<float>(cols);
#pragma unroll
    for (int i = 0; i < kCacheBwd; ++i) {
      const int64_t p = threadIdx.x + i * stride;
      if (p < packs) {
        const int n = pack_len(cols, p * kPack);
        float g[kPack], out[kPack];
        load_floats(gamma + p * kPack, n, vector, g);
#pragma unroll
        for (int e = 0; e < kPack; ++e) {
          const float d = to_float<T>(dc[i].e[e]);
          const float xh = (to_float<T>(xc[i].e[e]) - mu) * rs;
          out[e] = rs * (d * g[e] - mean_g - xh * mean_gx);
          if (e < n) {
            acc[p * kPack + e] += d * xh;
            acc[cols + p * kPack + e] += d;
          }
        }
        store_partial<T>(dx + row * cols + p * kPack, n, vector, out);
      }
    }
  }
  float* pg = partial + static_cast<int64_t>(blockIdx.x) * cols;
  float* pb = partial + static_cast<int64_t>(gridDim.x + blockIdx.x) * cols;
#pragma unroll
  for (int i = 0; i < kCacheBwd; ++i) {
    const int64_t p = threadIdx.x + i * stride;
    if (p < packs) {
      const int n = pack_len(cols, p * kPack);
#pragma unroll
      for (int e = 0; e < kPack; ++e)
        if (e < n) {
          pg[p * kPack + e] = acc[p * kPack + e];
          if (!kRms) pb[p * kPack + e] = acc[cols + p * kPack + e];
        }
    }
  }
}

/// dx only, for rows longer than the fused kernel holds: three passes over the row (the
/// second and third hit L1/L2).
template <typename T, bool kRms>
__global__ void __launch_bounds__(kMaxThreads)
    ln_backward_dx_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                          const float* __restrict__ mean, const float* __restrict__ rstd,
                          const float* __restrict__ gamma, T* __restrict__ dx, int64_t rows,
                          int64_t cols, bool vector) {
  __shared__ float scratch[64];
  const int64_t packs = (cols + kPack - 1) / kPack;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * cols;
    const T* dyr = dy + row * cols;
    const float mu = kRms ? 0.0f : mean[row], rs = rstd[row];
    float s_g = 0.0f, s_gx = 0.0f;
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      const int n = pack_len(cols, p * kPack);
      const Pack<T> xv = load_raw<T>(xr + p * kPack, n, vector);
      const Pack<T> dv = load_raw<T>(dyr + p * kPack, n, vector);
      float g[kPack];
      load_floats(gamma + p * kPack, n, vector, g);
#pragma unroll
      for (int e = 0; e < kPack; ++e) {
        const float gv = to_float<T>(dv.e[e]) * g[e];
        s_g += gv;
        s_gx += gv * (to_float<T>(xv.e[e]) - mu) * rs;
      }
    }
    const float2 sums = block_sum2(s_g, s_gx, scratch);
    const float mean_g = kRms ? 0.0f : sums.x / static_cast<float>(cols);
    const float mean_gx = sums.y / static_cast<float>(cols);
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      const int n = pack_len(cols, p * kPack);
      const Pack<T> xv = load_raw<T>(xr + p * kPack, n, vector);
      const Pack<T> dv = load_raw<T>(dyr + p * kPack, n, vector);
      float g[kPack], out[kPack];
      load_floats(gamma + p * kPack, n, vector, g);
#pragma unroll
      for (int e = 0; e < kPack; ++e) {
        const float xh = (to_float<T>(xv.e[e]) - mu) * rs;
        out[e] = rs * (to_float<T>(dv.e[e]) * g[e] - mean_g - xh * mean_gx);
      }
      store_partial<T>(dx + row * cols + p * kPack, n, vector, out);
    }
  }
}

/// Partial dgamma/dbeta for long rows: block (x: 256 columns, y: row chunk) writes
/// partial[y][col] and partial[gridDim.y + y][col].
template <typename T, bool kRms>
__global__ void ln_param_partial_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                        const float* __restrict__ mean,
                                        const float* __restrict__ rstd,
                                        float* __restrict__ partial, int64_t rows,
                                        int64_t cols) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  const int64_t chunk = (rows + gridDim.y - 1) / gridDim.y;
  const int64_t r0 = blockIdx.y * chunk, r1 = min(rows, r0 + chunk);
  float sg = 0.0f, sb = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    const float d = to_float<T>(dy[r * cols + col]);
    sg += d * (to_float<T>(x[r * cols + col]) - (kRms ? 0.0f : mean[r])) * rstd[r];
    sb += d;
  }
  partial[static_cast<int64_t>(blockIdx.y) * cols + col] = sg;
  if (!kRms) partial[static_cast<int64_t>(gridDim.y + blockIdx.y) * cols + col] = sb;
}

/// dgamma[col] = sum_k partial[k][col], dbeta[col] = sum_k partial[parts + k][col] (dbeta
/// null: RMSNorm, no second half).
__global__ void ln_param_reduce_kernel(const float* __restrict__ partial, int parts,
                                       float* __restrict__ dgamma, float* __restrict__ dbeta,
                                       int64_t cols) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  float sg = 0.0f, sb = 0.0f;
  for (int k = 0; k < parts; ++k) {
    sg += partial[static_cast<int64_t>(k) * cols + col];
    if (dbeta) sb += partial[static_cast<int64_t>(parts + k) * cols + col];
  }
  dgamma[col] = sg;
  if (dbeta) dbeta[col] = sb;
}

constexpr int kUnfusedParts = 64;  // row chunks of the column kernel

bool fused_backward(int64_t cols) {
  const int64_t packs = (cols + kPack - 1) / kPack;
  return packs <= static_cast<int64_t>(kCacheBwd) * kMaxThreadsBwd;
}

int backward_parts(int64_t rows, int64_t cols) {
  if (!fused_backward(cols)) return kUnfusedParts;
  const int64_t b = 2 * static_cast<int64_t>(sm_count());
  return static_cast<int>(rows < b ? (rows < 1 ? 1 : rows) : b);
}

template <bool kRms>
void norm_forward(DType t, const void* x, const float* gamma, const float* beta, void* y,
                  float* mean, float* rstd, int64_t rows, int64_t cols, float eps,
                  cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const int64_t packs = (cols + kPack - 1) / kPack;
  const bool vector = cols % kPack == 0 && aligned16(x) && aligned16(y) && aligned16(gamma) &&
                      (kRms || aligned16(beta));
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    LOOM_LAUNCH((ln_forward_kernel<T, kRms>), static_cast<unsigned>(rows), threads_for(packs), 0,
                stream)(
        static_cast<const T*>(x), gamma, beta, static_cast<T*>(y), mean, rstd, cols, eps,
        vector);
  });
  check_launch(kRms ? "rms_norm_forward" : "layer_norm_forward");
}

template <bool kRms>
void norm_backward(DType t, const void* dy, const void* x, const float* mean,
                   const float* rstd, const float* gamma, void* dx, float* dgamma,
                   float* dbeta, float* workspace, int64_t rows, int64_t cols,
                   cudaStream_t stream) {
  if (cols == 0) return;
  if (rows == 0) {  // no tokens: zero parameter gradients
    cudaMemsetAsync(dgamma, 0, cols * sizeof(float), stream);
    if (!kRms) cudaMemsetAsync(dbeta, 0, cols * sizeof(float), stream);
    check_launch("layer_norm_backward (memset)");
    return;
  }
  const int64_t packs = (cols + kPack - 1) / kPack;
  const bool vector =
      cols % kPack == 0 && aligned16(x) && aligned16(dy) && aligned16(dx) && aligned16(gamma);
  const int parts = backward_parts(rows, cols);
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    if (fused_backward(cols)) {
      // exactly `parts` (<= rows) blocks, each writing its two partial rows
      const size_t smem = 2 * static_cast<size_t>(cols) * sizeof(float);
      if (smem > 48 * 1024)
        cudaFuncSetAttribute(ln_backward_fused_kernel<T, kRms>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      const int threads = threads_for(packs, kCacheBwd, kMaxThreadsBwd);
      LOOM_LAUNCH((ln_backward_fused_kernel<T, kRms>), parts, threads, smem, stream)(
          static_cast<const T*>(dy), static_cast<const T*>(x), mean, rstd, gamma,
          static_cast<T*>(dx), workspace, rows, cols, vector);
      check_launch("layer_norm_backward_fused");
    } else {
      const int blocks = static_cast<int>(rows < 65535 ? rows : 65535);
      LOOM_LAUNCH((ln_backward_dx_kernel<T, kRms>), blocks, kMaxThreads, 0, stream)(
          static_cast<const T*>(dy), static_cast<const T*>(x), mean, rstd, gamma,
          static_cast<T*>(dx), rows, cols, vector);
      check_launch("layer_norm_backward_dx");
      const dim3 grid(static_cast<unsigned>((cols + 255) / 256), static_cast<unsigned>(parts));
      LOOM_LAUNCH((ln_param_partial_kernel<T, kRms>), grid, 256, 0, stream)(
          static_cast<const T*>(dy), static_cast<const T*>(x), mean, rstd, workspace, rows, cols);
      check_launch("layer_norm_param_partial");
    }
  });
  LOOM_LAUNCH(ln_param_reduce_kernel, static_cast<unsigned>((cols + 255) / 256), 256, 0,
              stream)(
      workspace, parts, dgamma, kRms ? nullptr : dbeta, cols);
  check_launch("layer_norm_param_reduce");
}

}  // namespace

void layer_norm_forward(DType t, const void* x, const float* gamma, const float* beta, void* y,
                        float* mean, float* rstd, int64_t rows, int64_t cols, float eps,
                        cudaStream_t stream) {
  norm_forward<false>(t, x, gamma, beta, y, mean, rstd, rows, cols, eps, stream);
}

int64_t layer_norm_backward_workspace(int64_t rows, int64_t cols) {
  return 2 * static_cast<int64_t>(backward_parts(rows, cols)) * cols;
}

void layer_norm_backward(DType t, const void* dy, const void* x, const float* mean,
                         const float* rstd, const float* gamma, void* dx, float* dgamma,
                         float* dbeta, float* workspace, int64_t rows, int64_t cols,
                         cudaStream_t stream) {
  norm_backward<false>(t, dy, x, mean, rstd, gamma, dx, dgamma, dbeta, workspace, rows, cols,
                       stream);
}

void rms_norm_forward(DType t, const void* x, const float* gamma, void* y, float* rstd,
                      int64_t rows, int64_t cols, float eps, cudaStream_t stream) {
  norm_forward<true>(t, x, gamma, nullptr, y, nullptr, rstd, rows, cols, eps, stream);
}

void rms_norm_backward(DType t, const void* dy, const void* x, const float* rstd,
                       const float* gamma, void* dx, float* dgamma, float* workspace, int64_t rows,
                       int64_t cols, cudaStream_t stream) {
  norm_backward<true>(t, dy, x, nullptr, rstd, gamma, dx, dgamma, nullptr, workspace, rows, cols,
                      stream);
}

}  // namespace loom::ops::cuda
