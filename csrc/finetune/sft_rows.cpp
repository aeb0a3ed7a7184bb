#include "finetune/sft_rows.h"

#include <fmt/format.h>

#include <stdexcept>

namespace loom::finetune {

SftRows make_sft_rows(const std::vector<std::vector<const SftExample*>>& rows, int64_t seq_length, int64_t pad_id,
                      bool answer_only_loss, bool packed) {
  SftRows out;
  out.rows = static_cast<int64_t>(rows.size());
  out.seq_length = seq_length;
  const size_t n = rows.size() * static_cast<size_t>(seq_length);
  out.tokens.assign(n, pad_id);
  out.labels.assign(n, pad_id);
  out.position_ids.assign(n, 0);
  out.loss_mask.assign(n, 0.0f);
  out.answer_mask.assign(n, 0.0f);
  if (packed) out.segment_ids.assign(n, 0);
  for (size_t r = 0; r < rows.size(); ++r) {
    if (!packed && rows[r].size() != 1)
      throw std::invalid_argument(fmt::format("sft rows: an unpacked row holds one example, row {} holds {}", r,
                                              rows[r].size()));
    const size_t base = r * static_cast<size_t>(seq_length);
    int64_t j = 0;  // the row's next position
    for (size_t k = 0; k < rows[r].size(); ++k) {
      const SftExample& e = *rows[r][k];
      if (e.size() < 2) throw std::invalid_argument("sft rows: an example of fewer than 2 tokens has no label");
      if (j + e.size() - 1 > seq_length)
        throw std::invalid_argument(fmt::format("sft rows: row {} needs more than {} positions", r, seq_length));
      for (int64_t i = 0; i + 1 < e.size(); ++i, ++j) {
        const size_t at = base + static_cast<size_t>(j);
        const auto next = static_cast<size_t>(i + 1);
        out.tokens[at] = e.tokens[static_cast<size_t>(i)];
        out.labels[at] = e.tokens[next];
        out.answer_mask[at] = e.answer[next];
        out.loss_mask[at] = answer_only_loss ? e.answer[next] : 1.0f;
        out.position_ids[at] = i;
        if (packed) out.segment_ids[at] = static_cast<int64_t>(k);
      }
    }
    for (int64_t p = j; p < seq_length; ++p) {
      const size_t at = base + static_cast<size_t>(p);
      if (packed) out.segment_ids[at] = static_cast<int64_t>(rows[r].size());
      else out.position_ids[at] = p;
    }
  }
  return out;
}

}  // namespace loom::finetune
