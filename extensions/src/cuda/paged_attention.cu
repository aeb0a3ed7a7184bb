// paged_attention CUDA kernel: one block per (query, head) task (grid-stride over the
// tasks); a query's row is its batch row (the row form) or, in the flat form, found by a binary
// search of query_starts on the device. The query goes to shared memory; each thread scores a strided subset of the row's
// visible keys, read through the block table (key j: slot j % block_size of block
// tables[r][j / block_size]), into a shared score row; a block max, exp and block sum make
// the softmax; then each thread sums probability × value for a strided subset of the head_dim
// columns. Dynamic shared memory: head_dim + max_blocks · block_size floats. Scores and sums
// in fp32, as the CPU kernel.
#include "cuda/common.cuh"
#include "cuda/paged_attention_launcher.h"

namespace loom::ops::cuda {
namespace {

constexpr int kThreads = 128;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    paged_attention_kernel(const T* __restrict__ q, const T* __restrict__ keys,
                           const T* __restrict__ values, const int64_t* __restrict__ tables,
                           const int64_t* __restrict__ lens, const int64_t* __restrict__ starts,
                           int64_t rows, T* __restrict__ out, int64_t tasks, int64_t heads,
                           int64_t per_group, int64_t d, int64_t kv_heads, int64_t block_size,
                           int64_t max_blocks, float scale) {
  __shared__ float scratch[32];
  LOOM_DYNAMIC_SHARED(float, smem);
  float* qs = smem;          // [d]
  float* scores = smem + d;  // [max_blocks * block_size]
  const int64_t group = heads / kv_heads;
  for (int64_t task = blockIdx.x; task < tasks; task += gridDim.x) {
    // q is [groups, heads, per_group, d]: the row form's groups are its rows.
    const int64_t g = task / (heads * per_group), h = (task / per_group) % heads;
    int64_t r = g, i = task % per_group, n = per_group;
    if (starts != nullptr) {  // the flat form: the last row r with starts[r] <= i (i < starts[rows])
      int64_t lo = 0, hi = rows - 1;
      while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (starts[mid] <= i) lo = mid; else hi = mid - 1;
      }
      r = lo;
      n = starts[r + 1] - starts[r];
      i -= starts[r];
    }
    const int64_t kh = h / group;
    const int64_t visible = lens[r] - n + i + 1;
    const int64_t* table = tables + r * max_blocks;
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) qs[c] = to_float<T>(q[task * d + c]);
    __syncthreads();
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < visible; j += blockDim.x) {
      const T* kj = keys + ((table[j / block_size] * kv_heads + kh) * block_size + j % block_size) * d;
      float dot = 0.0f;
      for (int64_t c = 0; c < d; ++c) dot += qs[c] * to_float<T>(kj[c]);
      scores[j] = dot * scale;
      mx = fmaxf(mx, scores[j]);
    }
    mx = block_max(mx, scratch);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < visible; j += blockDim.x) {
      scores[j] = expf(scores[j] - mx);
      sum += scores[j];
    }
    sum = block_sum(sum, scratch);  // its barriers also publish every thread's scores
    const float inv = 1.0f / sum;
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
      float acc = 0.0f;
      for (int64_t j = 0; j < visible; ++j) {
        const T* vj = values + ((table[j / block_size] * kv_heads + kh) * block_size + j % block_size) * d;
        acc += scores[j] * to_float<T>(vj[c]);
      }
      out[task * d + c] = from_float<T>(acc * inv);
    }
    __syncthreads();  // qs and scores are rewritten by the next task
  }
}

}  // namespace

void paged_attention_forward(DType t, const void* q, const void* keys, const void* values,
                             const int64_t* tables, const int64_t* lens, const int64_t* starts,
                             void* out, int64_t b, int64_t heads, int64_t n, int64_t d, int64_t kv_heads,
                             int64_t block_size, int64_t max_blocks, float scale,
                             cudaStream_t stream) {
  // The flat form's queries are one group of n = T; the row form's b groups of n.
  const int64_t groups = starts != nullptr ? 1 : b;
  const int64_t tasks = groups * heads * n;
  if (tasks == 0 || d == 0) return;
  const size_t smem = static_cast<size_t>(d + max_blocks * block_size) * sizeof(float);
  const unsigned grid = static_cast<unsigned>(tasks < (1 << 20) ? tasks : (1 << 20));
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    LOOM_LAUNCH(paged_attention_kernel<T>, grid, kThreads, smem, stream)(
        static_cast<const T*>(q), static_cast<const T*>(keys), static_cast<const T*>(values), tables,
        lens, starts, b, static_cast<T*>(out), tasks, heads, n, d, kv_heads, block_size, max_blocks, scale);
  });
  check_launch("paged_attention");
}

}  // namespace loom::ops::cuda
