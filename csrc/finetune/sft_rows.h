// Batch rows of supervised fine-tuning (docs/design/finetune.md, "Packed sequences"): the rows
// of a micro-batch as flat row-major [b, s] arrays, each row holding one example or, packed,
// several (placed by prompt_data::first_fit_decreasing). For a row holding examples e_0, e_1,
// ... (tokens t_k[0..n_k)) one after another, at the positions of example k:
//   tokens       t_k[0..n_k-1)                  (its n_k - 1 inputs)
//   labels       t_k[1..n_k)                    (next tokens)
//   loss_mask    answer_only_loss ? answer_k[1..n_k) : 1   (the label's token is an answer token)
//   answer_mask  answer_k[1..n_k)
//   position_ids 0 .. n_k - 2                   (restarting per example)
//   segment_ids  k
// and on the padding after the last example: pad_id, pad_id, 0, 0, position 0, segment id = the
// number of examples in the row. An unpacked row (one example) has positions 0 .. s-1 on every
// position, padding included, and no segment ids (SftRows::segment_ids empty), as pretraining.
#pragma once
#include <cstdint>
#include <vector>

#include "finetune/sft_dataset.h"

namespace loom::finetune {

struct SftRows {
  int64_t rows = 0, seq_length = 0;
  std::vector<int64_t> tokens, labels, position_ids;
  std::vector<int64_t> segment_ids;  ///< [rows, s] for packed rows, else empty
  std::vector<float> loss_mask, answer_mask;
};

/// Rows of `rows` (each a list of examples, in order) at `seq_length` positions; `packed`
/// gives segment ids and per-example positions. Throws std::invalid_argument when a row's
/// inputs exceed seq_length, an unpacked row holds other than one example, or an example has
/// fewer than 2 tokens.
SftRows make_sft_rows(const std::vector<std::vector<const SftExample*>>& rows, int64_t seq_length, int64_t pad_id,
                      bool answer_only_loss, bool packed);

}  // namespace loom::finetune
