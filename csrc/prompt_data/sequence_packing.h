// Packed sequences for supervised fine-tuning (docs/design/finetune.md, "Packed sequences"):
// several examples share one row of the run's sequence length, each keeping its own positions
// (restarting at 0) and, in the model, attention confined to itself. Examples are placed by
// first-fit decreasing, as NeMo's packing step offers, and the share of the rows' positions
// that hold an example's tokens is the packing efficiency it reports.
//
// An example of n tokens fills n - 1 input positions (tokens t[0..n-1) predicting t[1..n)).
// A packed row's positions, for the examples e_0, e_1, ... placed in it (in placement order):
//   tokens / labels / loss_mask: each example's own row of make_prompt_batch (prompt_batch.h)
//       cut to its n - 1 positions, one after the other; the rest pad_id / pad_id / 0;
//   position_ids: 0..n_k-2 within example k, 0 on padding;
//   segment_starts: the first position of every example, then the filled length (cu_seqlens).
#pragma once
#include <cstdint>
#include <vector>

#include "prompt_data/prompt_batch.h"
#include "prompt_data/prompt_example.h"
#include "prompt_data/task_template.h"

namespace loom::prompt_data {

struct SequencePacking {
  int64_t capacity = 0;                     ///< positions per packed row
  std::vector<std::vector<int64_t>> packs;  ///< example indices per row, in placement order
  int64_t filled = 0;                       ///< positions holding an example, over all rows

  /// filled / (rows × capacity): 1 when no position is padding; 0 with no rows.
  double efficiency() const;
};

/// First-fit decreasing: examples by length, longest first (ties: lower index first), each into
/// the first row with room for it, else a new row. `lengths[i]` is example i's input positions
/// (its tokens - 1). Throws std::invalid_argument when capacity < 1 or a length is < 1 or
/// exceeds capacity (naming the example index and both numbers).
SequencePacking first_fit_decreasing(const std::vector<int64_t>& lengths, int64_t capacity);

struct PackedRows {
  int64_t rows = 0;
  int64_t seq_length = 0;
  std::vector<int64_t> tokens;        ///< [rows, s]
  std::vector<int64_t> labels;        ///< [rows, s]
  std::vector<float> loss_mask;       ///< [rows, s]
  std::vector<int64_t> position_ids;  ///< [rows, s], restarting at 0 per example
  /// Per row: example starts then the filled length (the row's cu_seqlens; padding after it).
  std::vector<std::vector<int64_t>> segment_starts;
};

/// The rows of `packs` (indices into `examples`, e.g. some of SequencePacking::packs) at
/// `capacity` positions, as described above; `templates` as for make_prompt_batch. Throws
/// std::invalid_argument when an index is outside `examples`, an example has virtual tokens
/// (packing is for fine-tuning examples), a pack's examples need more than the capacity, or as
/// make_prompt_batch does.
PackedRows make_packed_rows(const std::vector<const PromptExample*>& examples,
                            const std::vector<std::vector<int64_t>>& packs, int64_t capacity,
                            const std::vector<ParsedTemplate>& templates, int64_t pad_id);

}  // namespace loom::prompt_data
