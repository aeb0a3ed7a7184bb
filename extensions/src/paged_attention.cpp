// loom::paged_attention's argument checks, shared by its CPU, CUDA and Meta kernels (one
// message for every backend), and its gather-based implementation for any device (CUDA's
// fallback for long rows). Shapes: loom_ops/ops.h.
#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "paged_attention.h"

#include "internal.h"

namespace loom::ops::internal {

void check_paged_attention(const at::Tensor& q, const at::Tensor& key_cache,
                           const at::Tensor& value_cache, const at::Tensor& block_tables,
                           const at::Tensor& context_lens, const std::optional<at::Tensor>& query_starts) {
  check_floating("paged_attention", "q", q);
  TORCH_CHECK(q.dim() == 4, "loom::paged_attention: q must be [b, heads, n, head_dim], got ", q.sizes());
  TORCH_CHECK(key_cache.dim() == 4 && key_cache.size(3) == q.size(3),
              "loom::paged_attention: key_cache must be [num_blocks, kv_heads, block_size, ",
              q.size(3), "], got ", key_cache.sizes());
  TORCH_CHECK(value_cache.sizes() == key_cache.sizes(),
              "loom::paged_attention: value_cache must have key_cache's shape ", key_cache.sizes(),
              ", got ", value_cache.sizes());
  TORCH_CHECK(key_cache.scalar_type() == q.scalar_type() && value_cache.scalar_type() == q.scalar_type(),
              "loom::paged_attention: key_cache and value_cache must have q's dtype ", q.scalar_type(),
              ", got ", key_cache.scalar_type(), " and ", value_cache.scalar_type());
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous(),
              "loom::paged_attention: key_cache and value_cache must be contiguous");
  const int64_t kv_heads = key_cache.size(1);
  TORCH_CHECK(kv_heads >= 1 && q.size(1) % kv_heads == 0,
              "loom::paged_attention: q's ", q.size(1), " heads must be a multiple of the cache's ",
              kv_heads, " kv heads");
  // The flat form: one batch row of q holds every row's queries, split by query_starts.
  const bool flat = query_starts.has_value();
  TORCH_CHECK(!flat || q.size(0) == 1, "loom::paged_attention: with query_starts, q must be [1, heads, T, head_dim], got ",
              q.sizes());
  const int64_t b = flat ? block_tables.size(0) : q.size(0);
  TORCH_CHECK(!flat || b > 0 || q.size(2) == 0,
              "loom::paged_attention: with query_starts, ", q.size(2), " queries need at least one row of block_tables");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && block_tables.dim() == 2 && block_tables.size(0) == b,
              "loom::paged_attention: block_tables must be int64 [", flat ? "b" : std::to_string(b),
              ", max_blocks], got ", block_tables.scalar_type(), " ", block_tables.sizes());
  TORCH_CHECK(context_lens.scalar_type() == at::kLong && context_lens.dim() == 1 && context_lens.size(0) == b,
              "loom::paged_attention: context_lens must be int64 [", b, "], got ", context_lens.scalar_type(), " ",
              context_lens.sizes());
  if (flat) {
    TORCH_CHECK(query_starts->scalar_type() == at::kLong && query_starts->dim() == 1 && query_starts->size(0) == b + 1,
                "loom::paged_attention: query_starts must be int64 [", b + 1, "], got ",
                query_starts->scalar_type(), " ", query_starts->sizes());
    check_same_device("paged_attention", q, "query_starts", *query_starts);
  }
  check_same_device("paged_attention", q, "key_cache", key_cache);
  check_same_device("paged_attention", q, "value_cache", value_cache);
  check_same_device("paged_attention", q, "block_tables", block_tables);
  check_same_device("paged_attention", q, "context_lens", context_lens);
}

}  // namespace loom::ops::internal

namespace loom::ops {

namespace internal {

// The flat form as the row form: every query becomes a row of one query, with its row's block
// table and its own position + 1 as the length (the tables and lengths stay on the device).
at::Tensor paged_attention_gather_flat(const at::Tensor& q, const at::Tensor& key_cache,
                                       const at::Tensor& value_cache, const at::Tensor& block_tables,
                                       const at::Tensor& context_lens, double scale,
                                       const at::Tensor& query_starts, int64_t max_gather_bytes) {
  const int64_t total = q.size(2), b = block_tables.size(0);
  if (total == 0 || b == 0) return at::empty_like(q, at::MemoryFormat::Contiguous);
  const auto long_options = block_tables.options();
  // Per query: its keys and values expanded to q's heads, and its scores, in the accumulation type.
  const int64_t longest = block_tables.size(1) * key_cache.size(2), heads = q.size(1), d = q.size(3);
  const int64_t per_query = heads * longest * (2 * d + 1) *
                            static_cast<int64_t>(at::elementSize(internal::acc_dtype(q.scalar_type())));
  const int64_t chunk = std::max<int64_t>(1, max_gather_bytes / std::max<int64_t>(per_query, 1));
  std::vector<at::Tensor> outs;
  for (int64_t first = 0; first < total; first += chunk) {
    const int64_t n = std::min(chunk, total - first);
    const at::Tensor t = at::arange(first, first + n, long_options);
    // The row of query t: the last r with query_starts[r] <= t (empty rows are skipped).
    const at::Tensor row = (at::searchsorted(query_starts, t, /*out_int32=*/false, /*right=*/true) - 1).clamp(0, b - 1);
    const at::Tensor ends = query_starts.index_select(0, row + 1);
    const at::Tensor lens = context_lens.index_select(0, row) - (ends - t) + 1;  // position of t, + 1
    const at::Tensor rows_q = q.select(0, 0).narrow(1, first, n).transpose(0, 1).unsqueeze(2);  // [n, heads, 1, d]
    outs.push_back(paged_attention_gather(rows_q, key_cache, value_cache, block_tables.index_select(0, row), lens,
                                          scale, std::nullopt));  // [n, heads, 1, d]
  }
  const at::Tensor out = outs.size() == 1 ? outs[0] : at::cat(outs, 0);
  return out.squeeze(2).transpose(0, 1).unsqueeze(0).contiguous();  // [1, heads, T, d]
}

}  // namespace internal

// Any device: gather each row's blocks into [b, kv_heads, max_blocks · block_size, d], then
// masked scores, softmax and ×V in the accumulation type. Memory O(b · heads · n · L): CUDA's
// fallback for rows longer than its kernel's shared memory holds (no host sync: the lengths
// stay on the device). Table entries past a row's blocks may hold anything: they are clamped, and the
// mask hides their keys. The flat form gathers per query, in chunks of at most
// internal::kMaxGatherBytes.
at::Tensor paged_attention_gather(const at::Tensor& q, const at::Tensor& key_cache,
                                  const at::Tensor& value_cache, const at::Tensor& block_tables,
                                  const at::Tensor& context_lens, double scale,
                                  const std::optional<at::Tensor>& query_starts) {
  internal::check_paged_attention(q, key_cache, value_cache, block_tables, context_lens, query_starts);
  if (query_starts)
    return internal::paged_attention_gather_flat(q, key_cache, value_cache, block_tables, context_lens, scale, *query_starts);
  const int64_t b = q.size(0), heads = q.size(1), n = q.size(2), d = q.size(3);
  const int64_t kv = key_cache.size(1), bs = key_cache.size(2), blocks = block_tables.size(1);
  const int64_t longest = blocks * bs;
  const auto acc = internal::acc_dtype(q.scalar_type());
  const at::Tensor ids = block_tables.clamp(0, key_cache.size(0) - 1).reshape({-1});
  auto gather = [&](const at::Tensor& cache) {
    at::Tensor rows = cache.index_select(0, ids).view({b, blocks, kv, bs, d}).permute({0, 2, 1, 3, 4});
    rows = rows.reshape({b, kv, longest, d}).to(acc);
    return kv == heads ? rows : rows.repeat_interleave(heads / kv, 1);  // [b, heads, L, d]
  };
  const at::Tensor keys = gather(key_cache), values = gather(value_cache);
  at::Tensor scores = at::matmul(q.to(acc), keys.transpose(-2, -1)) * scale;  // [b, heads, n, L]
  const auto long_options = block_tables.options();
  const at::Tensor last = context_lens.view({b, 1, 1, 1}) - n + at::arange(n, long_options).view({1, 1, n, 1});
  scores.masked_fill_(at::arange(longest, long_options).view({1, 1, 1, longest}) > last,
                      -std::numeric_limits<double>::infinity());
  return at::matmul(at::softmax(scores, -1), values).to(q.scalar_type()).contiguous();
}

}  // namespace loom::ops
