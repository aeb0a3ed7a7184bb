// Batch rows of prompt learning (docs/design/ptuning.md, "Batches"): a list of examples as flat
// row-major [b, s] arrays at the run's sequence length s (prompt_dataset.h), ready to become
// tensors. Tasks may be mixed in one batch; each row carries its task index.
//
// For row r holding example tokens t[0..n) (n <= s + 1), position j in [0, s):
//   tokens[r, j]       = t[j]            for j < n - 1, else pad_id      (model input)
//   labels[r, j]       = t[j + 1]        for j < n - 1, else pad_id      (next token)
//   virtual_mask[r, j] = is_virtual[j]   for j < n - 1, else 0           (input positions)
//   answer_mask[r, j]  = 1 when t[j + 1] is an answer token or the EOS after it
//                        (j + 1 in [answer_start, answer_start + answer_length)), else 0
//   loss_mask[r, j]    = answer_mask[r, j]      when the task has answer_only_loss,
//                        1 - is_virtual[j + 1]  otherwise (every label but the virtual ones);
//                        0 on padding (j >= n - 1)
//   task[r]            = the example's task index
// Padding uses pad_id (GPT-2: `<|endoftext|>`) and never counts in the loss or the accuracy.
#pragma once
#include <cstdint>
#include <vector>

#include "prompt_data/prompt_dataset.h"
#include "prompt_data/prompt_example.h"
#include "prompt_data/task_template.h"

namespace loom::prompt_data {

struct PromptBatch {
  int64_t batch = 0;                  ///< b rows
  int64_t seq_length = 0;             ///< s positions per row
  std::vector<int64_t> tokens;        ///< [b, s] input ids
  std::vector<int64_t> labels;        ///< [b, s] next-token ids
  std::vector<float> loss_mask;       ///< [b, s] 1.0 where the label counts in the loss
  std::vector<uint8_t> virtual_mask;  ///< [b, s] 1 at virtual input positions
  std::vector<uint8_t> answer_mask;   ///< [b, s] 1 where the label is part of the answer (EOS incl.)
  std::vector<int64_t> task;          ///< [b] task index per row
};

/// Rows of `examples` (pointers, not owned) at sequence length `seq_length`; `templates` is
/// the task list their task indices refer to (for answer_only_loss). Throws
/// std::invalid_argument when seq_length < 1, an example is an inference example (no labels),
/// has a task index outside `templates`, or has more than seq_length + 1 tokens.
PromptBatch make_prompt_batch(const std::vector<const PromptExample*>& examples,
                              const std::vector<ParsedTemplate>& templates, int64_t seq_length, int64_t pad_id);

/// Rows of `dataset`'s examples at `indices` (pad_id from the dataset's options). Throws
/// std::out_of_range for an index outside the dataset, else as above.
PromptBatch make_prompt_batch(const PromptDataset& dataset, const std::vector<int64_t>& indices, int64_t seq_length);

}  // namespace loom::prompt_data
