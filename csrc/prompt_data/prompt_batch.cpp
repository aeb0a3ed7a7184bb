#include "prompt_data/prompt_batch.h"

#include <fmt/format.h>

#include <stdexcept>

namespace loom::prompt_data {

PromptBatch make_prompt_batch(const std::vector<const PromptExample*>& examples,
                              const std::vector<ParsedTemplate>& templates, int64_t seq_length, int64_t pad_id) {
  if (seq_length < 1) throw std::invalid_argument(fmt::format("prompt batch: seq_length {} < 1", seq_length));
  const int64_t b = static_cast<int64_t>(examples.size());
  const size_t cells = static_cast<size_t>(b * seq_length);
  PromptBatch out;
  out.batch = b;
  out.seq_length = seq_length;
  out.tokens.assign(cells, pad_id);
  out.labels.assign(cells, pad_id);
  out.loss_mask.assign(cells, 0.0f);
  out.virtual_mask.assign(cells, 0);
  out.answer_mask.assign(cells, 0);
  out.task.resize(static_cast<size_t>(b));
  for (int64_t r = 0; r < b; ++r) {
    const PromptExample& ex = *examples[static_cast<size_t>(r)];
    if (ex.inference) throw std::invalid_argument(fmt::format("prompt batch: row {} is an inference example", r));
    if (ex.task < 0 || ex.task >= static_cast<int64_t>(templates.size())) {
      throw std::invalid_argument(fmt::format("prompt batch: row {} has task index {} of {} tasks", r, ex.task,
                                              templates.size()));
    }
    const int64_t n = ex.size();
    if (n > seq_length + 1) {
      throw std::invalid_argument(fmt::format(
          "prompt batch: row {} has {} tokens; sequence length {} holds at most {}", r, n, seq_length, seq_length + 1));
    }
    const bool answer_only = templates[static_cast<size_t>(ex.task)].spec.answer_only_loss;
    out.task[static_cast<size_t>(r)] = ex.task;
    const size_t row = static_cast<size_t>(r * seq_length);
    for (int64_t j = 0; j + 1 < n; ++j) {
      const size_t at = row + static_cast<size_t>(j);
      const size_t next = static_cast<size_t>(j + 1);
      out.tokens[at] = ex.tokens[static_cast<size_t>(j)];
      out.labels[at] = ex.tokens[next];
      out.virtual_mask[at] = ex.is_virtual[static_cast<size_t>(j)];
      const bool in_answer =
          ex.answer_start >= 0 && j + 1 >= ex.answer_start && j + 1 < ex.answer_start + ex.answer_length;
      out.answer_mask[at] = in_answer ? 1 : 0;
      out.loss_mask[at] = (answer_only ? in_answer : !ex.is_virtual[next]) ? 1.0f : 0.0f;
    }
  }
  return out;
}

PromptBatch make_prompt_batch(const PromptDataset& dataset, const std::vector<int64_t>& indices, int64_t seq_length) {
  std::vector<const PromptExample*> rows;
  rows.reserve(indices.size());
  for (int64_t i : indices) {
    if (i < 0 || i >= dataset.size()) {
      throw std::out_of_range(fmt::format("prompt batch: example {} of a dataset of {}", i, dataset.size()));
    }
    rows.push_back(&dataset[i]);
  }
  return make_prompt_batch(rows, dataset.templates(), seq_length, dataset.options().pad_id);
}

}  // namespace loom::prompt_data
