#include "data/gpt_indices.h"

#include <cmath>
#include <cstdint>
#include <numeric>

#include "data/data_error.h"
#include "data/numpy_random.h"

namespace loom::data {
namespace {

// _build_document_index: the documents tiled `epochs` times, shuffled (the final epoch on its
// own after the others when `separate_final_epoch`).
std::vector<int32_t> build_document_index(int64_t begin, int64_t end, int64_t epochs, NumpyRandomState& rng,
                                          bool separate_final_epoch) {
  if (!separate_final_epoch || epochs == 1) {
    std::vector<int32_t> idx;
    idx.reserve(static_cast<size_t>((end - begin) * epochs));
    for (int64_t e = 0; e < epochs; ++e)
      for (int64_t d = begin; d < end; ++d) idx.push_back(static_cast<int32_t>(d));
    rng.shuffle(idx);
    return idx;
  }
  auto first = build_document_index(begin, end, epochs - 1, rng, false);
  auto last = build_document_index(begin, end, 1, rng, false);
  first.insert(first.end(), last.begin(), last.end());
  return first;
}

std::vector<int64_t> shuffled_range(int64_t lo, int64_t hi, NumpyRandomState& rng) {
  std::vector<int64_t> v(static_cast<size_t>(hi - lo));
  std::iota(v.begin(), v.end(), lo);
  rng.shuffle(v);
  return v;
}

}  // namespace

int64_t tokens_per_epoch(UnalignedArray<int32_t> lengths, int64_t begin, int64_t end) {
  int64_t t = 0;
  for (int64_t i = begin; i < end; ++i) t += lengths[i];
  return t;
}

int64_t num_epochs_for(int64_t tpe, const GptIndexParams& p) {
  if (!p.num_samples) return 1;
  int64_t wanted = 0;
  if (__builtin_mul_overflow(*p.num_samples, p.seq_length, &wanted) || wanted == INT64_MAX)
    throw DataError("GPT dataset: " + std::to_string(*p.num_samples) + " samples of " + std::to_string(p.seq_length) +
                    " tokens overflow a 64-bit token count");
  wanted += p.add_extra_token ? 1 : 0;
  if (tpe <= 0) {
    if (wanted > 0) throw DataError("GPT dataset: the split has no tokens");
    return 1;
  }
  int64_t epochs = 1;
  for (int64_t tokens = tpe; tokens < wanted; tokens += tpe) ++epochs;
  return epochs;
}

namespace {

// Samples build_sample_index makes from `epochs` epochs of `tpe` tokens (the same formula).
int64_t expected_sample_count(int64_t epochs, int64_t tpe, const GptIndexParams& p) {
  const int64_t extra = p.add_extra_token ? 1 : 0;
  if (p.drop_last_partial_sequence) return (epochs * tpe - extra) / p.seq_length;
  return static_cast<int64_t>(std::ceil(static_cast<float>(epochs * tpe - extra) / static_cast<int32_t>(p.seq_length)));
}

}  // namespace

std::string check_gpt_indices(const GptIndices& ix, UnalignedArray<int32_t> lengths, int64_t begin, int64_t end,
                              const GptIndexParams& p) {
  const int64_t tpe = tokens_per_epoch(lengths, begin, end);
  if (tpe < 2 || p.seq_length < 2) return "the split cannot hold samples";
  const int64_t epochs = num_epochs_for(tpe, p);
  const int64_t docs = end - begin;
  const auto& doc = ix.document_index;
  if (static_cast<int64_t>(doc.size()) != epochs * docs)
    return "document_index has " + std::to_string(doc.size()) + " entries, expected " + std::to_string(epochs) +
           " epochs x " + std::to_string(docs) + " sequences";
  std::vector<int64_t> seen(static_cast<size_t>(docs), 0);
  for (size_t i = 0; i < doc.size(); ++i) {
    if (doc[i] < begin || doc[i] >= end)
      return "document_index[" + std::to_string(i) + "] = " + std::to_string(doc[i]) + " is outside the split's sequences [" +
             std::to_string(begin) + ", " + std::to_string(end) + ")";
    if (++seen[static_cast<size_t>(doc[i] - begin)] > epochs)
      return "document_index holds sequence " + std::to_string(doc[i]) + " more than once per epoch";
  }
  const int64_t samples = expected_sample_count(epochs, tpe, p);
  if (ix.sample_index.size() % 2 != 0 || ix.num_samples() != samples)
    return "sample_index has " + std::to_string(ix.sample_index.size() / 2) + " rows, expected " +
           std::to_string(samples + 1) + " (" + std::to_string(samples) + " samples)";
  const auto& si = ix.sample_index;
  if (si[0] != 0 || si[1] != 0) return "sample_index does not start at (0, 0)";
  const auto length_at = [&](int64_t pos) { return int64_t{lengths[doc[static_cast<size_t>(pos)]]}; };
  for (int64_t s = 0; s < samples; ++s) {
    const int64_t pb = si[2 * s], ob = si[2 * s + 1], pe = si[2 * s + 2], oe = si[2 * s + 3];
    const std::string row = "sample_index rows " + std::to_string(s) + "-" + std::to_string(s + 1);
    if (pb < 0 || pe < pb || pe >= static_cast<int64_t>(doc.size()))
      return row + ": document positions " + std::to_string(pb) + ", " + std::to_string(pe) +
             " are not increasing within [0, " + std::to_string(doc.size()) + ")";
    // GptDataset::text reads tokens [ob, len) of the first document ... [0, oe] of the last.
    const bool ok = pb == pe ? (ob >= 0 && ob <= oe + 1 && oe + 1 <= length_at(pe))
                             : (ob >= 0 && ob <= length_at(pb) && oe >= -1 && oe + 1 <= length_at(pe));
    if (!ok)
      return row + ": token offsets " + std::to_string(ob) + ", " + std::to_string(oe) +
             " are outside their documents (lengths " + std::to_string(length_at(pb)) + ", " +
             std::to_string(length_at(pe)) + ")";
  }
  const auto& sh = ix.shuffle_index;
  if (static_cast<int64_t>(sh.size()) != samples)
    return "shuffle_index has " + std::to_string(sh.size()) + " entries, expected " + std::to_string(samples);
  std::vector<bool> taken(static_cast<size_t>(samples), false);
  for (size_t i = 0; i < sh.size(); ++i) {
    if (sh[i] < 0 || sh[i] >= samples || taken[static_cast<size_t>(sh[i])])
      return "shuffle_index[" + std::to_string(i) + "] = " + std::to_string(sh[i]) +
             " makes it no permutation of [0, " + std::to_string(samples) + ")";
    taken[static_cast<size_t>(sh[i])] = true;
  }
  return "";
}

std::vector<int64_t> build_sample_index(UnalignedArray<int32_t> sizes, const std::vector<int32_t>& document_idx,
                                        int64_t seq_length, int64_t num_epochs, int64_t tpe,
                                        bool drop_last_partial_sequence, bool add_extra_token) {
  const int64_t extra = add_extra_token ? 1 : 0;
  int64_t num_samples;
  if (drop_last_partial_sequence) {
    num_samples = (num_epochs * tpe - extra) / seq_length;
  } else {
    // helpers.cpp computes this in single precision; keep it so the counts agree.
    num_samples = static_cast<int64_t>(std::ceil(static_cast<float>(num_epochs * tpe - extra) / static_cast<int32_t>(seq_length)));
  }
  std::vector<int64_t> sample_idx(static_cast<size_t>(2 * (num_samples + 1)));
  int64_t sample = 0, doc_pos = 0, doc_offset = 0;
  sample_idx[0] = 0;
  sample_idx[1] = 0;
  ++sample;
  const int64_t last_pos = static_cast<int64_t>(document_idx.size()) - 1;
  while (sample <= num_samples) {
    int64_t remaining = seq_length + extra;
    while (remaining != 0) {
      const int64_t doc_len = sizes[document_idx[doc_pos]] - doc_offset;
      remaining -= doc_len;
      if (remaining <= 0) {
        doc_offset += remaining + doc_len - extra;
        remaining = 0;
      } else {
        if (doc_pos == last_pos) {  // ran out of documents: the last (partial) sample ends here
          doc_offset = sizes[document_idx[doc_pos]] - extra;
          break;
        }
        ++doc_pos;
        doc_offset = 0;
      }
    }
    sample_idx[2 * sample] = doc_pos;
    sample_idx[2 * sample + 1] = doc_offset;
    ++sample;
  }
  return sample_idx;
}

GptIndices build_gpt_indices(UnalignedArray<int32_t> lengths, int64_t begin, int64_t end, const GptIndexParams& p) {
  if (p.seq_length < 2) throw DataError("GPT dataset: seq_length must be at least 2, got " + std::to_string(p.seq_length));
  if (p.num_samples && *p.num_samples < 0) throw DataError("GPT dataset: negative num_samples");
  GptIndices out;
  const int64_t tpe = tokens_per_epoch(lengths, begin, end);
  if (tpe < 2)
    throw DataError("GPT dataset: sequences [" + std::to_string(begin) + ", " + std::to_string(end) + ") hold " +
                    std::to_string(tpe) + " tokens; a split needs at least 2");
  const int64_t extra = p.add_extra_token ? 1 : 0;
  const int64_t epochs = num_epochs_for(tpe, p);
  int64_t samples_sans_final = 0;
  bool separate = false;
  if (epochs > 1) {
    samples_sans_final = ((epochs - 1) * tpe - extra) / p.seq_length;
    const int64_t from_final = *p.num_samples - samples_sans_final;
    const int64_t per_epoch = (tpe - extra) / p.seq_length;
    // Megatron asserts 0 <= from_final <= per_epoch + 1; the epoch count guarantees it.
    separate = from_final < static_cast<int64_t>(0.80 * static_cast<double>(per_epoch));
  }
  NumpyRandomState rng(p.seed);
  out.num_epochs = epochs;
  out.separate_final_epoch = separate;
  out.document_index = build_document_index(begin, end, epochs, rng, separate);
  out.sample_index = build_sample_index(lengths, out.document_index, p.seq_length, epochs, tpe,
                                        p.drop_last_partial_sequence, p.add_extra_token);
  const int64_t total = out.num_samples();
  if (separate) {
    out.shuffle_index = shuffled_range(0, samples_sans_final, rng);
    auto last = shuffled_range(samples_sans_final, total, rng);
    out.shuffle_index.insert(out.shuffle_index.end(), last.begin(), last.end());
  } else {
    out.shuffle_index = shuffled_range(0, total, rng);
  }
  return out;
}

}  // namespace loom::data
