// Key/value cache for incremental (autoregressive) decoding with a tensor-parallel GPT stage.
// Each layer keeps the keys and values of every position seen so far for this rank's heads,
// so a new token attends to the whole prefix without recomputing it: prefill the prompt in
// one call, then feed one token per call (GptStage::forward_cached). Attention of the n new
// queries over the L + n cached keys uses the offset causal mask of
// loom::ops::scaled_masked_softmax (key j hidden from query i when j > i + L), which gives
// exactly the rows of the full causal forward over the same sequence.
//
// Rows of different lengths (continuous batching, serve/engine.h): each cache row holds one
// sequence with its own length; select_rows() names the rows a forward call's batch rows are,
// the new positions of row r go to [row_length(r), row_length(r) + n), positions() gives their
// position ids and attention_mask() hides each row's keys past its own query (and the unused
// tail of shorter rows), so every row sees exactly what a batch of one would.
//
// Paged layout (KvCache::paged, used by `loom serve`, docs/serving.md "Paged KV cache"): each
// layer's keys and values are a pool [num_blocks, kv_heads_local, block_size, head_dim]; the
// owner (serve/kv_block_pool.h decides which blocks) gives each row its block table and length
// with set_row(); new positions are written to the slots of the row's blocks, and attend()
// reads them through the block tables with loom::ops::paged_attention (no mask is built: each
// row's causal limit comes from its own length). select_flat() feeds rows with different
// numbers of new positions in one forward without padding (chunked prefill beside decodes,
// docs/serving.md "Continuous batching with chunked prefill"): the forward's one batch row holds every selected row's new
// positions one after another, and paged_attention's flat form splits them by row.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace loom::model {

/// Grouped-query attention's sharing: kv [b, g, s, d] as [b, heads, s, d], key/value head j
/// serving query heads [j·heads/g, (j+1)·heads/g) (a view when heads == g). Throws
/// std::invalid_argument when g does not divide heads.
at::Tensor expand_kv_heads(const at::Tensor& kv, int64_t heads);

class KvCache {
 public:
  /// Buffers for global layers [first_layer, first_layer + num_layers), each key and value
  /// [batch, heads_local, capacity, head_dim] of `options` (dtype, device), zero-filled.
  /// Throws std::invalid_argument for a non-positive size.
  KvCache(int first_layer, int num_layers, int64_t batch, int64_t heads_local, int64_t head_dim,
          int64_t capacity, const at::TensorOptions& options);

  /// The paged layout: `rows` rows, each layer's keys and values
  /// [num_blocks, kv_heads_local, block_size, head_dim] of `options`, zero-filled. kv_heads_local
  /// is the cache's heads on this rank (the query heads, or fewer query groups with
  /// grouped-query attention). Rows hold nothing until set_row() gives them blocks. Throws
  /// std::invalid_argument for a non-positive size.
  static KvCache paged(int first_layer, int num_layers, int64_t rows, int64_t num_blocks,
                       int64_t block_size, int64_t kv_heads_local, int64_t head_dim,
                       const at::TensorOptions& options);
  bool is_paged() const { return block_size_ > 0; }
  int64_t block_size() const { return block_size_; }  ///< 0 for the contiguous layout
  /// Paged layout: row `row` holds `length` positions in `blocks` (its i-th block holds its
  /// positions [i · block_size, (i + 1) · block_size)); the table must have room for the
  /// positions a forward call adds. Throws std::out_of_range for a bad row or block id, or a
  /// length past the table, std::logic_error on the contiguous layout.
  void set_row(int64_t row, std::vector<int64_t> blocks, int64_t length);
  /// Global layer `layer`'s keys and values (the pool [num_blocks, kv_heads, block_size, d] in
  /// the paged layout, [rows, heads, capacity, d] otherwise): tests read them.
  std::pair<at::Tensor, at::Tensor> layer_storage(int layer) const;

  /// Positions committed so far: the longest selected row (all rows equal unless rows of
  /// different lengths were used).
  int64_t length() const;
  int64_t capacity() const { return capacity_; }  ///< most positions a row can hold
  /// Batch rows of a forward call: the selected rows (select_rows), else every row; 1 after
  /// select_flat (one row of every selected row's new positions).
  int64_t batch() const { return counts_.empty() ? static_cast<int64_t>(selected_.size()) : 1; }
  int64_t rows() const { return batch_; }  ///< rows allocated

  /// The next calls (append, advance, positions, attention_mask) act on cache rows `rows`
  /// (distinct, in [0, rows())), batch row i being cache row rows[i]; empty: every row in
  /// order. Throws std::out_of_range naming a bad row.
  void select_rows(const std::vector<int64_t>& rows);
  /// Paged layout: the next forward call (positions, attend, advance with n = the sum of
  /// `counts`) feeds one batch row holding counts[0] new positions of cache row rows[0], then
  /// counts[1] of rows[1], ... (rows distinct; a count may be 0). select_rows() ends it. Throws
  /// std::out_of_range naming a bad row or a negative count, std::logic_error on the
  /// contiguous layout.
  void select_flat(const std::vector<int64_t>& rows, const std::vector<int64_t>& counts);
  bool is_flat() const { return !counts_.empty(); }
  /// One past the last position n new positions of each selected row reach (the largest
  /// row_length(r) + n; flat: row_length(rows[i]) + counts[i]).
  int64_t end_position(int64_t n) const;
  int64_t row_length(int64_t row) const { return lengths_.at(static_cast<size_t>(row)); }
  /// Forgets row `row`'s positions (a new sequence takes the row).
  void clear_row(int64_t row) {
    lengths_.at(static_cast<size_t>(row)) = 0;
    paged_index_.n = -1;
  }

  /// Position ids [batch(), n] int64 (on `options`' device) of n new positions of each
  /// selected row: row_length(r) + [0, n). Flat: [1, n], row rows[i]'s row_length + [0, counts[i])
  /// one after another (n must be the sum of the counts).
  at::Tensor positions(int64_t n, const at::TensorOptions& options) const;
  /// nullopt when the selected rows have one length (the offset causal mask is exact);
  /// otherwise the bool mask [batch(), 1, n, length() + n] (true = hidden) that hides key j
  /// from new query i of row r when j > row_length(r) + i, on `device`. Not for the flat form
  /// (std::logic_error).
  std::optional<at::Tensor> attention_mask(int64_t n, const at::Device& device) const;

  /// Stores k, v [batch(), heads_local, n, head_dim] at positions [row_length(r), + n) of each
  /// selected row r of global layer `layer` and returns that layer's keys and values of the
  /// selected rows at [0, length() + n) (views when every row is selected in order).
  /// Throws std::out_of_range when the layer is not cached here or length + n > capacity,
  /// std::invalid_argument on a shape mismatch.
  /// Contiguous layout only (std::logic_error when paged).
  std::pair<at::Tensor, at::Tensor> append(int layer, const at::Tensor& k, const at::Tensor& v);

  /// Both layouts: stores k, v [batch(), kv_heads_local, n, head_dim] of the n new positions of
  /// each selected row of global layer `layer` (as append; flat: [1, kv_heads_local, sum of
  /// counts, head_dim], each row's positions in turn) and returns the causal attention of
  /// q [batch(), heads, n, head_dim] (heads a multiple of kv_heads_local: grouped-query
  /// attention shares each key/value head among heads / kv_heads_local queries) over each row's positions [0, row_length + n), scores
  /// scaled by `scale`: [batch(), heads, n, head_dim]. Errors as append; paged: a row without
  /// room for n more positions in its blocks throws std::out_of_range.
  at::Tensor attend(int layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    double scale);

  /// Commits n positions of every selected row once every layer has appended them (flat: n is
  /// the sum of the counts, and each row commits its count). Throws std::out_of_range past the
  /// capacity (paged: past a row's blocks).
  void advance(int64_t n);
  /// Forgets every position of every row (the buffers are reused) and selects every row.
  void reset();

  /// Fixed-shape decode steps (serve/decode_graphs.h, docs/serving.md "Decode graphs"): the
  /// new positions of b rows, one each, in the flat form (one batch row of b positions), as
  /// device tensors the caller fills before each forward call. Their shapes and addresses never
  /// change, so one captured CUDA graph of the forward serves every step of that b.
  struct StaticIndex {
    at::Tensor positions;        ///< [1, b] int64: each new position's id
    at::Tensor blocks, offsets;  ///< [b] int64: the block and the offset in it of its slot
    at::Tensor tables;           ///< [b, max_blocks] int64: each row's block table
    at::Tensor lengths;          ///< [b] int64: positions each row holds, the new one included
    at::Tensor starts;           ///< [b + 1] int64: 0, 1, ..., b
  };
  /// Paged layout: while `index` is set (non-null; the caller keeps it alive), positions() and
  /// attend() read the new positions' ids, slots, tables and lengths from it instead of
  /// building them from the rows' host state (no host-to-device copy in the forward), and
  /// advance() commits nothing: the caller advances the real rows (select_flat, then advance)
  /// once `index` is unset (null). std::logic_error on the contiguous layout.
  void use_static_index(const StaticIndex* index);
  /// Paged layout: row `row`'s block table (std::out_of_range for a bad row).
  const std::vector<int64_t>& row_blocks(int64_t row) const { return tables_.at(static_cast<size_t>(row)); }

 private:
  KvCache() = default;  // paged()
  bool all_selected() const;  // every row, in order
  bool one_length() const;    // the selected rows have one length
  int index_of(int layer) const;
  void check_new(const at::Tensor& k, const at::Tensor& v) const;
  void check_flat_total(int64_t n, const char* what) const;  // flat: n is the sum of the counts
  int64_t new_count(size_t i, int64_t n) const { return counts_.empty() ? n : counts_[i]; }
  // Paged: the slots of the selected rows' next n positions and their tables, made once per
  // forward call (every layer writes the same slots).
  struct PagedIndex {
    int64_t n = -1;
    at::Tensor blocks, offsets;         // [b · n] the slot of each new position
    at::Tensor tables, lengths;         // [b, max_blocks], [b] (the n new ones included)
    at::Tensor starts;                  // flat: [b + 1] query starts; else undefined
  };
  const PagedIndex& paged_index(int64_t n, const at::Device& device);
  int first_layer_;
  int64_t batch_, heads_local_, head_dim_, capacity_;
  int64_t block_size_ = 0, num_blocks_ = 0;      // paged layout
  std::vector<std::vector<int64_t>> tables_;     // paged: per row
  PagedIndex paged_index_;
  const StaticIndex* static_index_ = nullptr;  // use_static_index
  std::vector<int64_t> lengths_;   // per row
  std::vector<int64_t> selected_;  // rows of the next forward
  std::vector<int64_t> counts_;    // flat: new positions of each selected row; empty otherwise
  std::vector<at::Tensor> keys_, values_;
};

}  // namespace loom::model
