// Choosing the next token of many requests in one batched computation on the logits' device
// (the serving engine's step, docs/serving.md "Sampling"), by TokenSampler's rules
// (sampling.h): repetition penalty, a banned stop token, then greedy (argmax, lowest id among
// equal maxima) or softmax(z / T) over the top-k in order of decreasing logit (lower id first
// among equals), cut to the nucleus top-p, renormalised, and the first token whose cumulative
// probability exceeds the row's uniform u. Each row's u comes from its own TokenSampler
// (draw_uniform, on the host, no device wait), so a request draws the same numbers whether it
// is sampled alone on the host or in a batch on a device. Probabilities and sums are in
// float64 as on the host; on the CPU the cumulative sums run in the host's order, and the
// result differs from TokenSampler::next only where ATen's vectorised exp and std::exp round
// a probability differently (at most an ulp) AND u falls within that ulp of a cumulative
// boundary. Everything the host needs comes back in ONE device-to-host copy.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "generate/sampling.h"

namespace loom::generate {

/// One request's row of a batched choice.
struct SampleRow {
  SamplingOptions options;                  ///< greedy, temperature, top_k, top_p, repetition_penalty
  const std::vector<int64_t>* penalized = nullptr;  ///< tokens the repetition penalty applies to (the context)
  int64_t banned_token = -1;                ///< logit -inf (the stop token before min_new_tokens); -1: none
  double uniform = 0;                       ///< u in [0, 1) (TokenSampler::draw_uniform); unused when greedy
  int64_t top_logprobs = 0;                 ///< alternatives reported with the token's log-probability
};

/// The choices, on the host.
struct SampledRows {
  std::vector<int64_t> tokens;              ///< -1 where the row failed
  std::vector<std::string> errors;          ///< empty, or why (a NaN or +inf logit after the penalty)
  /// log-softmax of the raw logits at the token, in float64, and the top_logprobs most probable
  /// (decreasing, lower id first among equals).
  std::vector<double> logprobs;
  std::vector<std::vector<std::pair<int64_t, double>>> top;
};

/// logits [rows.size(), V] (any float dtype, any device; the full vocabulary) -> one choice per
/// row. Throws std::invalid_argument for a shape mismatch or bad options (validate()).
SampledRows sample_rows(const at::Tensor& logits, const std::vector<SampleRow>& rows);

}  // namespace loom::generate
