// loom::paged_attention, the `loom` op library's read of a paged KV cache (serving; see
// docs/serving.md, "Paged KV cache"). In its own header so that the many users of ops.h do
// not depend on it. Calls the registered op through the dispatcher (CPU, CUDA or Meta kernel
// of its inputs' device); Python sees it as torch.ops.loom.paged_attention. Schema:
// extensions/src/schemas.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace loom::ops {

/// Attention of n new queries over keys and values held in a paged cache (inference only, no
/// autograd; docs/serving.md, "Paged KV cache"):
///   q [b, a, n, d]; key_cache, value_cache [num_blocks, kv_heads, block_size, d], contiguous,
///   q's dtype; block_tables int64 [b, max_blocks] (row r's i-th block holds its positions
///   [i · block_size, (i + 1) · block_size)); context_lens int64 [b]: positions row r holds,
///   the n new ones included (n <= context_lens[r] <= max_blocks · block_size).
/// Query i of row r sits at position context_lens[r] - n + i and sees keys j <= that position
/// (causal). The flat form (chunked prefill: rows with different numbers of new queries, no
/// padding), when query_starts is given: q [1, a, T, d] holds every row's queries, row r's
/// being q[0, :, query_starts[r] : query_starts[r + 1]] (n_r of them, 0 allowed);
/// query_starts int64 [b + 1] runs from 0 to T without decreasing (vLLM's query_start_loc);
/// query i of row r sits at position context_lens[r] - n_r + i; returns [1, a, T, d].
/// In both forms query head h reads kv head h / (a / kv_heads) (a must be a multiple of kv_heads:
/// grouped-query attention). Scores, softmax and the weighted sum are in fp32 (fp64 for
/// float64). Returns q's shape and dtype: softmax(q kᵀ · scale) v row by row, as
/// core_attention over each row's contiguous keys gives. On CPU, block ids outside
/// [0, num_blocks) or lengths out of range throw c10::Error naming the row; CUDA does not read
/// the tables on the host (no check). CUDA: a kernel for rows up to about 12k positions (its
/// scores in 48 KiB of shared memory), beyond that and for float64 a gather of the rows'
/// blocks and ATen ops.
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& key_cache,
                           const at::Tensor& value_cache, const at::Tensor& block_tables,
                           const at::Tensor& context_lens, double scale,
                           const std::optional<at::Tensor>& query_starts = std::nullopt);

}  // namespace loom::ops
