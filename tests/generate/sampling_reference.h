// An independent host reference of the documented sampling rules (generate/sampling.h,
// generate/sampling_batch.h), for tests of sample_rows: scalar loops in float64 over one row,
// sharing no code with the batched ATen implementation. The repetition penalty (each distinct
// context id once: a positive logit divided, a negative one multiplied, rounded to float), the
// banned token at -inf, then greedy (first maximum) or softmax(z / T) over the top-k in order
// of decreasing logit (lower id first among equals), cut to the nucleus top-p (keep a token
// while the mass before it is below p), renormalised; the token is the first whose cumulative
// probability exceeds u, else the last kept one.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "generate/sampling.h"

namespace loom::generate::test {

inline std::vector<float> reference_processed(std::vector<float> z, const SamplingOptions& o,
                                              const std::vector<int64_t>& context, int64_t banned) {
  const int64_t n = static_cast<int64_t>(z.size());
  if (o.repetition_penalty != 1.0) {
    std::vector<bool> done(z.size(), false);
    for (int64_t id : context) {
      if (id < 0 || id >= n || done[static_cast<size_t>(id)]) continue;
      done[static_cast<size_t>(id)] = true;
      const double v = z[static_cast<size_t>(id)];
      z[static_cast<size_t>(id)] = static_cast<float>(v > 0 ? v / o.repetition_penalty : v * o.repetition_penalty);
    }
  }
  if (banned >= 0 && banned < n) z[static_cast<size_t>(banned)] = -std::numeric_limits<float>::infinity();
  return z;
}

/// Candidates in draw order and their renormalised probabilities, from processed logits z.
inline void reference_candidates(const std::vector<float>& z, const SamplingOptions& o, std::vector<int64_t>& ids,
                                 std::vector<double>& probs) {
  const int64_t n = static_cast<int64_t>(z.size());
  auto before = [&z](int64_t a, int64_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); };
  ids.assign(static_cast<size_t>(n), 0);
  std::iota(ids.begin(), ids.end(), int64_t{0});
  std::stable_sort(ids.begin(), ids.end(), before);
  if (o.greedy) {
    ids.resize(1);
    probs = {1.0};
    return;
  }
  const int64_t k = o.top_k > 0 ? std::min<int64_t>(o.top_k, n) : n;
  ids.resize(static_cast<size_t>(k));
  const double top = static_cast<double>(z[ids[0]]) / o.temperature;
  probs.assign(static_cast<size_t>(k), 0.0);
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) sum += probs[i] = std::exp(static_cast<double>(z[ids[i]]) / o.temperature - top);
  for (auto& p : probs) p /= sum;
  if (o.top_p < 1.0) {
    double mass = 0;
    int64_t keep = 0;
    while (keep < k && mass < o.top_p) mass += probs[static_cast<size_t>(keep++)];
    ids.resize(static_cast<size_t>(keep));
    probs.resize(static_cast<size_t>(keep));
    double kept = 0;
    for (double p : probs) kept += p;
    for (auto& p : probs) p /= kept;
  }
}

/// The distribution (id order) a row with these options draws from.
inline std::vector<double> reference_distribution(const std::vector<float>& raw, const SamplingOptions& o,
                                                  const std::vector<int64_t>& context = {}, int64_t banned = -1) {
  std::vector<int64_t> ids;
  std::vector<double> probs;
  reference_candidates(reference_processed(raw, o, context, banned), o, ids, probs);
  std::vector<double> out(raw.size(), 0.0);
  for (size_t i = 0; i < ids.size(); ++i) out[static_cast<size_t>(ids[i])] = probs[i];
  return out;
}

/// The token a row with these options and uniform u chooses.
inline int64_t reference_token(const std::vector<float>& raw, const SamplingOptions& o, double u,
                               const std::vector<int64_t>& context = {}, int64_t banned = -1) {
  std::vector<int64_t> ids;
  std::vector<double> probs;
  reference_candidates(reference_processed(raw, o, context, banned), o, ids, probs);
  if (o.greedy) return ids[0];
  double cumulative = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    cumulative += probs[i];
    if (u < cumulative) return ids[i];
  }
  return ids.back();
}

}  // namespace loom::generate::test
