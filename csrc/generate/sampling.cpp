#include "generate/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace loom::generate {

void validate(const SamplingOptions& o) {
  if (!(o.repetition_penalty > 0.0) || !std::isfinite(o.repetition_penalty))
    throw std::invalid_argument("--repetition-penalty must be a positive number (1: off), found " +
                                std::to_string(o.repetition_penalty));
  if (o.greedy) return;
  if (!(o.temperature > 0.0) || !std::isfinite(o.temperature))
    throw std::invalid_argument("--temperature must be a positive number, found " +
                                std::to_string(o.temperature) + " (use --greedy for argmax)");
  if (o.top_k < 0)
    throw std::invalid_argument("--top-k must be >= 0 (0: no limit), found " +
                                std::to_string(o.top_k));
  if (!(o.top_p > 0.0 && o.top_p <= 1.0))
    throw std::invalid_argument("--top-p must lie in (0, 1], found " + std::to_string(o.top_p));
}

void apply_repetition_penalty(float* logits, int64_t n, const std::vector<int64_t>& seen, double penalty) {
  if (penalty == 1.0) return;
  std::vector<bool> done(static_cast<size_t>(n), false);
  for (int64_t id : seen) {
    if (id < 0 || id >= n || done[static_cast<size_t>(id)]) continue;
    done[static_cast<size_t>(id)] = true;
    const double z = logits[id];
    logits[id] = static_cast<float>(z > 0 ? z / penalty : z * penalty);
  }
}

TokenSampler::TokenSampler(const SamplingOptions& options) : options_(options), rng_(options.seed) {
  validate(options_);
}

void TokenSampler::candidates(const float* logits, int64_t n, std::vector<int64_t>& ids,
                              std::vector<double>& probs) const {
  if (n <= 0) throw std::invalid_argument("TokenSampler: no logits to sample from");
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(logits[i]) || logits[i] == std::numeric_limits<float>::infinity())
      throw std::invalid_argument("TokenSampler: logit of token " + std::to_string(i) +
                                  " is " + std::to_string(logits[i]));
  }
  ids.clear();
  probs.clear();
  // Decreasing logit, lower id first among equals: the draw order, identical on every rank.
  auto before = [logits](int64_t a, int64_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (options_.greedy) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i)
      if (before(i, best)) best = i;
    ids.push_back(best);
    probs.push_back(1.0);
    return;
  }
  ids.resize(n);
  std::iota(ids.begin(), ids.end(), int64_t(0));
  const int64_t k = options_.top_k > 0 ? std::min<int64_t>(options_.top_k, n) : n;
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), before);
  ids.resize(k);

  // softmax(z / T) over the top-k, in double.
  const double inv_t = 1.0 / options_.temperature;
  const double top = static_cast<double>(logits[ids[0]]) * inv_t;
  double sum = 0.0;
  probs.resize(k);
  for (int64_t i = 0; i < k; ++i) {
    probs[i] = std::exp(static_cast<double>(logits[ids[i]]) * inv_t - top);
    sum += probs[i];
  }
  for (auto& p : probs) p /= sum;

  // Nucleus: keep tokens while the probability of the ones before them is below top_p.
  if (options_.top_p < 1.0) {
    double before_mass = 0.0;
    int64_t keep = 0;
    while (keep < k && before_mass < options_.top_p) before_mass += probs[keep++];
    ids.resize(keep);
    probs.resize(keep);
    double kept = 0.0;
    for (double p : probs) kept += p;
    for (auto& p : probs) p /= kept;
  }
}

std::vector<double> TokenSampler::distribution(const float* logits, int64_t n) const {
  std::vector<int64_t> ids;
  std::vector<double> probs;
  candidates(logits, n, ids, probs);
  std::vector<double> out(static_cast<size_t>(n), 0.0);
  for (size_t i = 0; i < ids.size(); ++i) out[ids[i]] = probs[i];
  return out;
}

double TokenSampler::draw_uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

int64_t TokenSampler::next(const float* logits, int64_t n) {
  std::vector<int64_t> ids;
  std::vector<double> probs;
  candidates(logits, n, ids, probs);
  if (options_.greedy) return ids[0];
  const double u = draw_uniform();
  double cumulative = 0.0;
  for (size_t i = 0; i < ids.size(); ++i) {
    cumulative += probs[i];
    if (u < cumulative) return ids[i];
  }
  return ids.back();  // u above the rounded total
}

int64_t TokenSampler::next_token(float* logits, int64_t n, const std::vector<int64_t>& context, int64_t generated,
                                 int64_t stop_token, int64_t min_new_tokens) {
  apply_repetition_penalty(logits, n, context, options_.repetition_penalty);
  if (generated < min_new_tokens && stop_token >= 0 && stop_token < n)
    logits[stop_token] = -std::numeric_limits<float>::infinity();
  return next(logits, n);
}

}  // namespace loom::generate
