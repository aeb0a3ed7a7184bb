// Per-forward-call dropout key: what the trainer supplies so that every dropout mask is a pure
// function of (seed, step, layer, site, global element position) — docs/design/sp_sar.md "Dropout
// randomness". Layers add (layer, site) and the global block of the tensor they hold, so any
// tensor/sequence/pipeline/data-parallel layout, any micro-batch split and any recompute
// setting draws exactly the masks of a single-process run over the whole global batch.
#pragma once
#include <cstdint>
#include <vector>

#include "loom_ops/ops.h"

namespace loom::model {

struct DropoutContext {
  uint64_t seed = 1234;      ///< run seed (Philox key)
  uint64_t step = 0;         ///< counter distinct per optimizer step (< 2^40), e.g. iteration
  /// Global sample index (row of the global batch) of this micro-batch's row 0: for DP rank d
  /// holding micro-batch k of size b with `m` micro-batches per rank, e.g. (d·m + k)·b.
  int64_t batch_offset = 0;
  /// Rows in the global batch; -1: the local micro-batch is the whole batch.
  int64_t global_batch = -1;
  bool training = true;      ///< false: no dropout at all (evaluation)

  /// Dropout of site `site` (loom::ops::DropoutSite) of global layer `layer` on a local
  /// [s_local, b, h] activation that starts at sequence position `seq_offset` of the full
  /// [seq_length, B, h] tensor. p = 0 when not training.
  ops::DropoutSpec hidden(double p, int64_t layer, uint32_t site, int64_t seq_length,
                          int64_t seq_offset, int64_t b_local, int64_t hidden_size) const;
  /// Attention-probability dropout on local [b, heads_local, s, s] probabilities whose heads
  /// start at global head `head_offset` of `heads` in total.
  ops::DropoutSpec attention(double p, int64_t layer, int64_t b_local, int64_t heads,
                             int64_t head_offset, int64_t s) const;

 private:
  int64_t global_rows(int64_t b_local) const;
};

}  // namespace loom::model
