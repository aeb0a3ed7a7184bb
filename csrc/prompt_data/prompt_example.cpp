#include "prompt_data/prompt_example.h"

#include <fmt/format.h>

namespace loom::prompt_data {

ExampleOptions example_options(const data::Tokenizer& tokenizer) {
  ExampleOptions options;
  options.bos_id = tokenizer.bos_id();
  options.eod_id = tokenizer.eod_id();
  options.pad_id = tokenizer.pad_id();
  return options;
}

namespace {

std::string fields_list(const ParsedTemplate& t) {
  std::string out = "[";
  for (size_t i = 0; i < t.spec.prompt_template_fields.size(); ++i)
    out += (i ? ", " : "") + t.spec.prompt_template_fields[i];
  return out + "]";
}

bool is_field(const ParsedTemplate& t, const std::string& key) {
  for (const auto& f : t.spec.prompt_template_fields)
    if (f == key) return true;
  return false;
}

}  // namespace

std::optional<std::string> record_problem(const PromptRecord& record, const ParsedTemplate& tmpl,
                                          bool answer_required) {
  const std::string who = fmt::format("task '{}'", tmpl.taskname());
  for (const auto& [key, value] : record) {
    if (!is_field(tmpl, key)) {
      return fmt::format("{}: key '{}' is not a field of the task; expected 'taskname' or one of "
                         "prompt_template_fields {}",
                         who, key, fields_list(tmpl));
    }
  }
  for (const auto& f : tmpl.spec.prompt_template_fields) {
    if (record.count(f)) continue;
    const bool is_answer = tmpl.spec.answer_field && f == *tmpl.spec.answer_field;
    if (!is_answer) {
      return fmt::format("{}: the record has no field '{}'; expected every field of prompt_template_fields {}", who,
                         f, fields_list(tmpl));
    }
    if (answer_required) {
      return fmt::format("{}: the record has no answer field '{}'; only inference records may leave out the "
                         "answer",
                         who, f);
    }
  }
  return std::nullopt;
}

namespace {

// The ids of every template piece of one record, before truncation.
struct PieceIds {
  std::vector<std::vector<int32_t>> ids;  ///< per piece; virtual pieces have none
  std::vector<int32_t> answer_ids;        ///< the answer's ids (kept for scoring)
  int64_t total = 0;                      ///< tokens of the example: BOS, virtual and piece ids
};

// Ids of every piece; virtual pieces only count. The answer piece is left out of an
// inference example (its ids are kept for scoring).
PieceIds encode_pieces(const PromptRecord& record, const ParsedTemplate& tmpl, const data::Tokenizer& tokenizer,
                       const ExampleOptions& options, bool inference) {
  const auto& pieces = tmpl.pieces;
  PieceIds out;
  out.ids.resize(pieces.size());
  out.total = options.add_bos ? 1 : 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const TemplatePiece& p = pieces[i];
    std::vector<int32_t>& ids = out.ids[i];
    switch (p.kind) {
      case TemplatePiece::Kind::kText:
        tokenizer.encode(p.text, ids);
        break;
      case TemplatePiece::Kind::kVirtual:
        out.total += p.num_virtual;
        continue;
      case TemplatePiece::Kind::kField: {
        auto it = record.find(p.field);
        if (it == record.end()) continue;  // the absent answer
        if (p.leading_space) {
          tokenizer.encode(" " + it->second, ids);
        } else {
          tokenizer.encode(it->second, ids);
        }
        if (tmpl.answer_piece && i == *tmpl.answer_piece) {
          out.answer_ids = ids;
          if (inference) {
            ids.clear();
            continue;
          }
        }
        break;
      }
    }
    out.total += static_cast<int64_t>(ids.size());
  }
  return out;
}

// The example's tokens: BOS, then each piece (virtual pieces as pad ids flagged virtual), then
// EOS when `eos`; the prompt and answer spans.
void lay_out_tokens(PromptExample& ex, const ParsedTemplate& tmpl, const PieceIds& encoded,
                    const ExampleOptions& options, bool eos) {
  const auto& pieces = tmpl.pieces;
  ex.tokens.reserve(static_cast<size_t>(encoded.total));
  ex.is_virtual.reserve(static_cast<size_t>(encoded.total));
  auto push = [&](int64_t id, bool virt) {
    ex.tokens.push_back(id);
    ex.is_virtual.push_back(virt ? 1 : 0);
  };
  if (options.add_bos) push(options.bos_id, false);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const TemplatePiece& p = pieces[i];
    if (p.kind == TemplatePiece::Kind::kVirtual) {
      for (int64_t k = 0; k < p.num_virtual; ++k) push(options.pad_id, true);
      continue;
    }
    if (!ex.inference && tmpl.answer_piece && i == *tmpl.answer_piece) ex.answer_start = ex.size();
    for (int32_t id : encoded.ids[i]) push(id, false);
  }
  ex.prompt_length = ex.answer_start >= 0 ? ex.answer_start : ex.size();
  if (eos) push(options.eod_id, false);
  if (ex.answer_start >= 0) ex.answer_length = ex.size() - ex.answer_start;
  ex.answer_tokens.assign(encoded.answer_ids.begin(), encoded.answer_ids.end());
}

}  // namespace

std::optional<PromptExample> make_prompt_example(const PromptRecord& record, int64_t task, const ParsedTemplate& tmpl,
                                                 const data::Tokenizer& tokenizer, const ExampleOptions& options) {
  if (options.max_seq_length < 1) {
    throw data::DataError(fmt::format("prompt examples: max_seq_length is {}; expected at least 1",
                                      options.max_seq_length));
  }
  if (auto problem = record_problem(record, tmpl, false)) throw data::DataError(*problem);

  const bool has_answer = tmpl.answer_piece && record.count(tmpl.pieces[*tmpl.answer_piece].field);
  const bool inference = options.for_inference || (tmpl.answer_piece && !has_answer);
  PieceIds encoded = encode_pieces(record, tmpl, tokenizer, options, inference);
  const bool eos = options.add_eos && !inference;
  if (eos) ++encoded.total;

  PromptExample ex;
  if (encoded.total > options.max_seq_length) {
    if (!tmpl.truncate_piece) return std::nullopt;
    auto& cut = encoded.ids[*tmpl.truncate_piece];
    const int64_t excess = encoded.total - options.max_seq_length;
    if (static_cast<int64_t>(cut.size()) < excess) return std::nullopt;
    cut.resize(cut.size() - static_cast<size_t>(excess));
    ex.truncated = excess;
    encoded.total = options.max_seq_length;
  }
  if (encoded.total < (inference ? 1 : 2)) return std::nullopt;

  ex.task = task;
  ex.inference = inference;
  lay_out_tokens(ex, tmpl, encoded, options, eos);
  return ex;
}

}  // namespace loom::prompt_data
