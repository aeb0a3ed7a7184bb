// LayerNorm forward/backward CUDA kernels (fp32 statistics and accumulation).
// Forward: one block per row; the row is held in registers (up to kCache packs of 8 per
// thread, i.e. rows up to 512 * 8 * 4 = 16384 elements) for the two-pass mean/variance and
// the output, so x is read from memory once. Longer rows re-read the tail (L1/L2).
// Backward: blocks stride over rows computing dx and accumulate dgamma/dbeta partial sums
// of the columns they own in registers; each block writes one partial row to a workspace
// and a second kernel sums the partial rows. Rows too long for the register partials use
// a column kernel for the partials instead.
#include "cuda/common.cuh"

namespace loom::ops::cuda {
namespace {

constexpr int kCache = 4;        // packs of 8 held per thread
constexpr int kMaxThreads = 512;

int threads_for(int64_t packs) {
  const int64_t t = round_up_warp((packs + kCache - 1) / kCache);
  return static_cast<int>(t < 32 ? 32 : (t > kMaxThreads ? kMaxThreads : t));
}

template <typename T>
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
  float cache[kCache][kPack];

  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kCache; ++i) {
    const int64_t p = threadIdx.x + i * stride;
    if (p < packs) {
      const int n = pack_len(cols, p * kPack);
      load_partial<T>(xr + p * kPack, n, vector, cache[i]);
#pragma unroll
      for (int e = 0; e < kPack; ++e) sum += cache[i][e];
    }
  }
  for (int64_t p = threadIdx.x + kCache * stride; p < packs; p += stride) {
    float v[kPack];
    load_partial<T>(xr + p * kPack, pack_len(cols, p * kPack), vector, v);
#pragma unroll
    for (int e = 0; e < kPack; ++e) sum += v[e];
  }
  const float mu = block_sum(sum, scratch) / static_cast<float>(cols);

  float sq = 0.0f;
#pragma unroll
  for (int i = 0; i < kCache; ++i) {
    const int64_t p = threadIdx.x + i * stride;
    if (p < packs) {
      const int n = pack_len(cols, p * kPack);
#pragma unroll
      for (int e = 0; e < kPack; ++e) {
        const float d = e < n ? cache[i][e] - mu : 0.0f;
        sq += d * d;
      }
    }
  }
  for (int64_t p = threadIdx.x + kCache * stride; p < packs; p += stride) {
    float v[kPack];
    const int n = pack_len(cols, p * kPack);
    load_partial<T>(xr + p * kPack, n, vector, v);
#pragma unroll
    for (int e = 0; e < kPack; ++e) {
      const float d = e < n ? v[e] - mu : 0.0f;
      sq += d * d;
    }
  }
  const float rs = rsqrtf(block_sum(sq, scratch) / static_cast<float>(cols) + eps);

  auto write = [&](int64_t p, float v[kPack]) {
    const int n = pack_len(cols, p * kPack);
    float g[kPack], b[kPack];
    if (vector && n == kPack) {
      const float4* g4 = reinterpret_cast<const float4*>(gamma + p * kPack);
      const float4* b4 = reinterpret_cast<const float4*>(beta + p * kPack);
      *reinterpret_cast<float4*>(g) = g4[0];
      *reinterpret_cast<float4*>(g + 4) = g4[1];
      *reinterpret_cast<float4*>(b) = b4[0];
      *reinterpret_cast<float4*>(b + 4) = b4[1];
    } else {
#pragma unroll
      for (int e = 0; e < kPack; ++e) {
        g[e] = e < n ? gamma[p * kPack + e] : 0.0f;
        b[e] = e < n ? beta[p * kPack + e] : 0.0f;
      }
    }
#pragma unroll
    for (int e = 0; e < kPack; ++e) v[e] = (v[e] - mu) * rs * g[e] + b[e];
    store_partial<T>(yr + p * kPack, n, vector, v);
  };
#pragma unroll
  for (int i = 0; i < kCache; ++i) {
    const int64_t p = threadIdx.x + i * stride;
    if (p < packs) write(p, cache[i]);
  }
  for (int64_t p = threadIdx.x + kCache * stride; p < packs; p += stride) {
    float v[kPack];
    load_partial<T>(xr + p * kPack, pack_len(cols, p * kPack), vector, v);
    write(p, v);
  }
  if (threadIdx.x == 0) {
    mean_out[row] = mu;
    rstd_out[row] = rs;
  }
}

/// dx for rows blockIdx.x, blockIdx.x + gridDim.x, ...; with `partial` non-null also the
/// block's dgamma/dbeta partial sums (columns of packs threadIdx.x + i * blockDim.x,
/// i < kCache, which must cover the row) written to partial[blockIdx.x][0..cols) and
/// partial[gridDim.x + blockIdx.x][0..cols).
template <typename T>
__global__ void __launch_bounds__(kMaxThreads)
    ln_backward_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                       const float* __restrict__ mean, const float* __restrict__ rstd,
                       const float* __restrict__ gamma, T* __restrict__ dx,
                       float* __restrict__ partial, int64_t rows, int64_t cols, bool vector) {
  __shared__ float scratch[32];
  const int64_t packs = (cols + kPack - 1) / kPack;
  const int64_t stride = blockDim.x;
  float acc_g[kCache][kPack], acc_b[kCache][kPack];
#pragma unroll
  for (int i = 0; i < kCache; ++i)
#pragma unroll
    for (int e = 0; e < kPack; ++e) acc_g[i][e] = acc_b[i][e] = 0.0f;

  auto load_gamma = [&](int64_t p, int n, float g[kPack]) {
#pragma unroll
    for (int e = 0; e < kPack; ++e) g[e] = e < n ? gamma[p * kPack + e] : 0.0f;
  };

  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * cols;
    const T* dyr = dy + row * cols;
    const float mu = mean[row], rs = rstd[row];
    float s_g = 0.0f, s_gx = 0.0f;  // sum g, sum g * xhat with g = dy * gamma
    for (int64_t p = threadIdx.x; p < packs; p += stride) {
      const int n = pack_len(cols, p * kPack);
      float xv[kPack], dv[kPack], g[kPack];
      load_partial<T>(xr + p * kPack, n, vector, xv);
      load_partial<T>(dyr + p * kPack, n, vector, dv);
      load_gamma(p, n, g);
#pragma unroll
      for (int e = 0; e < kPack; ++e) {
        const float gv = dv[e] * g[e];
        s_g += gv;
        s_gx += gv * (xv[e] - mu) * rs;
      }
    }
    const float mean_g = block_sum(s_g, scratch) / static_cast<float>(cols);
    const float mean_gx = block_sum(s_gx, scratch) / static_cast<float>(cols);

    auto emit = [&](int64_t p, float acc_gi[kPack], float acc_bi[kPack], bool accumulate) {
      const int n = pack_len(cols, p * kPack);
      float xv[kPack], dv[kPack], g[kPack], out[kPack];
      load_partial<T>(xr + p * kPack, n, vector, xv);
      load_partial<T>(dyr + p * kPack, n, vector, dv);
      load_gamma(p, n, g);
#pragma unroll
      for (int e = 0; e < kPack; ++e) {
        const float xh = (xv[e] - mu) * rs;
        out[e] = rs * (dv[e] * g[e] - mean_g - xh * mean_gx);
        if (accumulate) {
          acc_gi[e] += dv[e] * xh;
          acc_bi[e] += dv[e];
        }
      }
      store_partial<T>(dx + row * cols + p * kPack, n, vector, out);
    };
    if (partial) {
#pragma unroll
      for (int i = 0; i < kCache; ++i) {
        const int64_t p = threadIdx.x + i * stride;
        if (p < packs) emit(p, acc_g[i], acc_b[i], true);
      }
    } else {
      for (int64_t p = threadIdx.x; p < packs; p += stride) emit(p, acc_g[0], acc_b[0], false);
    }
  }
  if (partial) {
    float* pg = partial + static_cast<int64_t>(blockIdx.x) * cols;
    float* pb = partial + static_cast<int64_t>(gridDim.x + blockIdx.x) * cols;
#pragma unroll
    for (int i = 0; i < kCache; ++i) {
      const int64_t p = threadIdx.x + i * stride;
      if (p < packs) {
        const int n = pack_len(cols, p * kPack);
#pragma unroll
        for (int e = 0; e < kPack; ++e)
          if (e < n) {
            pg[p * kPack + e] = acc_g[i][e];
            pb[p * kPack + e] = acc_b[i][e];
          }
      }
    }
  }
}

/// Partial dgamma/dbeta for rows too long for the register partials: block (x: 256
/// columns, y: row chunk) writes partial[y][col] and partial[gridDim.y + y][col].
template <typename T>
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
    sg += d * (to_float<T>(x[r * cols + col]) - mean[r]) * rstd[r];
    sb += d;
  }
  partial[static_cast<int64_t>(blockIdx.y) * cols + col] = sg;
  partial[static_cast<int64_t>(gridDim.y + blockIdx.y) * cols + col] = sb;
}

/// dgamma[col] = sum_k partial[k][col], dbeta[col] = sum_k partial[parts + k][col].
__global__ void ln_param_reduce_kernel(const float* __restrict__ partial, int parts,
                                       float* __restrict__ dgamma, float* __restrict__ dbeta,
                                       int64_t cols) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  float sg = 0.0f, sb = 0.0f;
  for (int k = 0; k < parts; ++k) {
    sg += partial[static_cast<int64_t>(k) * cols + col];
    sb += partial[static_cast<int64_t>(parts + k) * cols + col];
  }
  dgamma[col] = sg;
  dbeta[col] = sb;
}

bool fused_partials(int64_t cols) {
  const int64_t packs = (cols + kPack - 1) / kPack;
  return packs <= static_cast<int64_t>(kCache) * kMaxThreads;
}

int backward_blocks(int64_t rows, int64_t cols) {
  if (fused_partials(cols)) {
    const int64_t b = 2 * static_cast<int64_t>(sm_count());
    return static_cast<int>(rows < b ? (rows < 1 ? 1 : rows) : b);
  }
  return 64;  // row chunks of the column kernel
}

}  // namespace

void layer_norm_forward(DType t, const void* x, const float* gamma, const float* beta, void* y,
                        float* mean, float* rstd, int64_t rows, int64_t cols, float eps,
                        cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const int64_t packs = (cols + kPack - 1) / kPack;
  const bool vector = cols % kPack == 0 && aligned16(x) && aligned16(y) && aligned16(gamma) &&
                      aligned16(beta);
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    ln_forward_kernel<T><<<static_cast<unsigned>(rows), threads_for(packs), 0, stream>>>(
        static_cast<const T*>(x), gamma, beta, static_cast<T*>(y), mean, rstd, cols, eps,
        vector);
  });
  check_launch("layer_norm_forward");
}

int64_t layer_norm_backward_workspace(int64_t rows, int64_t cols) {
  return 2 * static_cast<int64_t>(backward_blocks(rows, cols)) * cols;
}

void layer_norm_backward(DType t, const void* dy, const void* x, const float* mean,
                         const float* rstd, const float* gamma, void* dx, float* dgamma,
                         float* dbeta, float* workspace, int64_t rows, int64_t cols,
                         cudaStream_t stream) {
  if (cols == 0) return;
  if (rows == 0) {  // no tokens: zero parameter gradients
    cudaMemsetAsync(dgamma, 0, cols * sizeof(float), stream);
    cudaMemsetAsync(dbeta, 0, cols * sizeof(float), stream);
    check_launch("layer_norm_backward (memset)");
    return;
  }
  const int64_t packs = (cols + kPack - 1) / kPack;
  const bool vector =
      cols % kPack == 0 && aligned16(x) && aligned16(dy) && aligned16(dx) && aligned16(gamma);
  const bool fused = fused_partials(cols);
  const int parts = backward_blocks(rows, cols);
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    // Fused: exactly `parts` blocks (<= rows), each writing its partial rows.
    const int blocks = fused ? parts : static_cast<int>(rows < 65535 ? rows : 65535);
    ln_backward_kernel<T><<<blocks, threads_for(packs), 0, stream>>>(
        static_cast<const T*>(dy), static_cast<const T*>(x), mean, rstd, gamma,
        static_cast<T*>(dx), fused ? workspace : nullptr, rows, cols, vector);
    check_launch("layer_norm_backward");
    if (!fused) {
      const dim3 grid(static_cast<unsigned>((cols + 255) / 256), static_cast<unsigned>(parts));
      ln_param_partial_kernel<T><<<grid, 256, 0, stream>>>(
          static_cast<const T*>(dy), static_cast<const T*>(x), mean, rstd, workspace, rows, cols);
      check_launch("layer_norm_param_partial");
    }
  });
  ln_param_reduce_kernel<<<static_cast<unsigned>((cols + 255) / 256), 256, 0, stream>>>(
      workspace, parts, dgamma, dbeta, cols);
  check_launch("layer_norm_param_reduce");
}

}  // namespace loom::ops::cuda
