// Internal declarations of loom::paged_attention (schemas.cpp; public face
// loom_ops/paged_attention.h): the argument checks every backend shares, the CPU, CUDA and
// Meta kernels, and the gather-based composition of ATen ops that CUDA falls back to for rows
// too long for its kernel's shared memory and the CPU kernel runs a prefill chunk's row with. Kept apart from internal.h and kernels.h so the
// other ops do not depend on it.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace loom::ops {

namespace internal {
/// Shapes, dtypes and devices of paged_attention's arguments (not the values of the tables).
/// With query_starts (the flat form), q is [1, heads, T, d] and query_starts int64 [b + 1].
void check_paged_attention(const at::Tensor& q, const at::Tensor& key_cache,
                           const at::Tensor& value_cache, const at::Tensor& block_tables,
                           const at::Tensor& context_lens,
                           const std::optional<at::Tensor>& query_starts);

/// The gather composition's flat form (query_starts [b + 1]): each query of q [1, heads, T, d]
/// attends as a row of its own, taken in chunks of queries whose gathered keys, values and
/// scores stay within `max_gather_bytes` (at least one query per chunk), so that a long context
/// beside a large step budget does not gather T copies of it at once. Returns [1, heads, T, d].
inline constexpr int64_t kMaxGatherBytes = int64_t{256} << 20;
at::Tensor paged_attention_gather_flat(const at::Tensor& q, const at::Tensor& key_cache,
                                       const at::Tensor& value_cache, const at::Tensor& block_tables,
                                       const at::Tensor& context_lens, double scale,
                                       const at::Tensor& query_starts, int64_t max_gather_bytes = kMaxGatherBytes);
}  // namespace internal

#define LOOM_DECLARE_PAGED_ATTENTION(suffix)                                                    \
  at::Tensor paged_attention_##suffix(const at::Tensor& q, const at::Tensor& key_cache,         \
                                      const at::Tensor& value_cache,                            \
                                      const at::Tensor& block_tables,                           \
                                      const at::Tensor& context_lens, double scale,             \
                                      const std::optional<at::Tensor>& query_starts);

LOOM_DECLARE_PAGED_ATTENTION(cpu)
LOOM_DECLARE_PAGED_ATTENTION(cuda)
LOOM_DECLARE_PAGED_ATTENTION(meta)
LOOM_DECLARE_PAGED_ATTENTION(gather)

#undef LOOM_DECLARE_PAGED_ATTENTION

}  // namespace loom::ops
