// Fixed-shape decode steps of `loom serve` (docs/serving.md "Decode graphs"; vLLM's CUDA-graph
// runner and its capture sizes are the model): a step in which every request decodes one token
// runs at the smallest batch-size bucket (1, 2, 4, 8, 16, 24, ... up to --max-batch) that holds
// it, its inputs (token ids, positions, KV slots, block tables, lengths) copied in one
// host-to-device copy into buffers preallocated for the largest bucket, the rows past the real
// ones padding (token 0 at position 0, its keys and values written to a scratch block no
// request owns, its logits ignored). The forward then reads nothing from the host, so on CUDA
// (t = 1) each bucket's forward is captured once as a CUDA graph (warm-up and capture on a
// side stream, every bucket's graph in one memory pool) and replayed in every later step of
// that bucket; on every other device, and at t > 1, the same buffers run eagerly, so the
// bucketing and padding are what CPU and stand-in CI test.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/gpt_stage.h"
#include "model/kv_cache.h"

namespace loom::serve {

/// `loom serve --cuda-graphs`: auto (fixed-shape decode steps, captured, on CUDA at t = 1 and
/// p = 1 only), on (fixed-shape decode steps on any device; captured where auto would
/// capture, eager elsewhere), off (every step as scheduled; vLLM's --enforce-eager).
enum class DecodeGraphMode { kAuto, kOn, kOff };

/// "auto", "on" or "off"; std::invalid_argument naming --cuda-graphs otherwise.
DecodeGraphMode parse_decode_graph_mode(const std::string& name);

/// The batch-size buckets for `max_batch` rows (>= 1): 1, 2, 4, then multiples of 8, those
/// below max_batch, and max_batch itself last.
std::vector<int64_t> decode_graph_buckets(int64_t max_batch);

/// The smallest of `buckets` (increasing) holding `rows`; std::out_of_range when rows < 1 or
/// past the last.
int64_t decode_graph_bucket(const std::vector<int64_t>& buckets, int64_t rows);

/// What the fixed-shape decode steps did so far.
struct DecodeGraphStats {
  int64_t steps = 0;        ///< decode steps run at a bucket
  int64_t padded_rows = 0;  ///< padding rows those steps computed
  int64_t captures = 0;     ///< CUDA graphs captured (one per bucket used, CUDA only)
  std::map<int64_t, int64_t> steps_by_bucket;
  /// Host waits from the filled inputs to the ready logits, summed over the steps, as counted
  /// by a device plugin that counts them (runtime::device_host_waits: the stand-in); nullopt
  /// where nothing counts (CPU, CUDA).
  std::optional<int64_t> region_host_waits;
};

class DecodeGraphs {
 public:
  /// For a whole model `stage` (first and last stage) and its paged `cache` (both kept by
  /// reference), rows of up to `max_batch`; `scratch_block` is a block of `cache` no request
  /// owns (padding rows write there). `capture`: capture and replay CUDA graphs (the stage
  /// must be on CUDA at t = 1; std::invalid_argument otherwise). Allocates the buffers of the
  /// largest bucket: (5 + max_blocks) · largest int64 on the device (max_blocks = a row's
  /// widest block table: ceil(context / block_size)) and as many on the host (pinned off the CPU).
  DecodeGraphs(const model::GptStage& stage, model::KvCache& cache, int64_t max_batch, int64_t scratch_block,
               bool capture);
  ~DecodeGraphs();

  /// Whether cache row `row`'s block table fits the buffers' tables (it always does for a
  /// request within the context; the engine runs the step as scheduled otherwise).
  bool fits(int64_t row) const;
  /// One decode step: tokens[i] is the next token of cache row rows[i] (rows distinct, the
  /// cache's flat selection of rows with one new position each, as GenerationEngine selects
  /// them), at position row_length(rows[i]); runs the forward at the bucket of rows.size(),
  /// then advances each row by one. Returns the logits [rows.size(), 1, vocab / t] (a view of
  /// the bucket's output, valid until the next call). std::out_of_range for more rows than the
  /// largest bucket or a row whose table does not fit.
  at::Tensor run(const std::vector<int64_t>& tokens, const std::vector<int64_t>& rows);

  const std::vector<int64_t>& buckets() const { return buckets_; }
  bool captures() const { return capture_; }
  const DecodeGraphStats& stats() const { return stats_; }

 private:
  struct Graphs;  // CUDA only: the captured graphs, their pool and outputs
  at::Tensor forward(int64_t bucket);
  at::Tensor replay(int64_t bucket);  // CUDA: the bucket's graph, captured at its first step

  const model::GptStage& stage_;
  model::KvCache& cache_;
  std::vector<int64_t> buckets_;
  int64_t largest_, max_blocks_, scratch_block_;
  bool capture_;
  at::Tensor host_, device_;  // [(5 + max_blocks) · largest] int64: tokens, positions, blocks, offsets, lengths, tables
  at::Tensor starts_;         // [largest + 1] int64: 0, 1, ..., largest
  std::map<int64_t, model::KvCache::StaticIndex> index_;  // by bucket: views of device_
  std::unique_ptr<Graphs> graphs_;
  DecodeGraphStats stats_;
};

}  // namespace loom::serve
