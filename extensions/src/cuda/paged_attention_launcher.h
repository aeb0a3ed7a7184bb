// Raw-pointer CUDA launcher of the paged_attention kernel (paged_attention.cu), apart from
// launchers.h so the other kernels do not depend on it; same conventions (DType, the given
// stream, std::runtime_error naming the kernel on a failed launch, contiguous arrays).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/launchers.h"

namespace loom::ops::cuda {

/// out [b, heads, n, d] = causal attention of q [b, heads, n, d] over the keys and values of
/// the paged caches [num_blocks, kv_heads, block_size, d] that tables [b, max_blocks] and lens
/// [b] (positions held, the n new ones included) name; query i of row r sits at position
/// lens[r] - n + i and reads kv head h / (heads / kv_heads). The flat form, starts non-null
/// ([b + 1], from 0 to n, not decreasing): q and out are [1, heads, n, d], row r's queries
/// [starts[r], starts[r + 1]), query i of them at position lens[r] - (starts[r + 1] -
/// starts[r]) + i. Needs
/// (d + max_blocks · block_size) · 4 bytes of shared memory per block.
void paged_attention_forward(DType t, const void* q, const void* keys, const void* values,
                             const int64_t* tables, const int64_t* lens, const int64_t* starts,
                             void* out, int64_t b,
                             int64_t heads, int64_t n, int64_t d, int64_t kv_heads,
                             int64_t block_size, int64_t max_blocks, float scale,
                             cudaStream_t stream);

}  // namespace loom::ops::cuda
