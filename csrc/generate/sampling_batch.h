// Choosing the next token of many requests in one batched computation on the logits' device
// (the serving engine's step, docs/serving.md "Sampling", and `loom generate`'s, one row): the
// one place of the sampling rules (options in sampling.h): repetition penalty, a banned stop token, then greedy (argmax, lowest id among
// equal maxima) or softmax(z / T) over the top-k in order of decreasing logit (lower id first
// among equals), cut to the nucleus top-p, renormalised, and the first token whose cumulative
// probability exceeds the row's uniform u. Each row's u comes from its own TokenSampler
// (draw_uniform, on the host, no device wait), so a request draws the same numbers whether it
// is sampled alone or in a batch. Probabilities and cumulative sums are in float64, the sums
// sequential scans in draw order. Everything the host needs comes back in ONE device-to-host
// copy (a row that fails on a NaN or +inf logit adds one, for its message).
//
// Speculative decoding (docs/serving.md "Speculative decoding"): a row may verify a drafted
// token x. Without draft probabilities (n-gram drafts, a point mass q = δx) the row draws as
// above and accepts x when the draw is x: probability p(x), and a rejected row's token is then
// distributed as normalize(max(0, p − δx)), Leviathan et al.'s rule, with the very draw the
// request makes without speculation. With draft probabilities q (a draft model) the row
// accepts x when accept_uniform · q(x) < p(x) (probability min(1, p(x)/q(x))) and otherwise
// draws from normalize(max(0, p − q)) with its uniform (Leviathan et al. 2023, "Fast Inference
// from Transformers via Speculative Decoding", Algorithm 1). Greedy rows accept while their
// argmax is the draft.
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
  bool logprob = true;                      ///< report the token's log-probability (false and no top_logprobs: NaN)
  int64_t top_logprobs = 0;                 ///< alternatives reported with the token's log-probability
  int64_t draft_token = -1;                 ///< a drafted token this row verifies; -1: none
  double accept_uniform = 0;                ///< u in [0, 1) of the draft's acceptance test (with draft_probs)
};

/// The choices, on the host.
struct SampledRows {
  std::vector<int64_t> tokens;              ///< -1 where the row failed
  std::vector<std::string> errors;          ///< empty, or why (a NaN or +inf logit after the penalty)
  /// log-softmax of the raw logits at the token, in float64 (NaN for a row that does not ask:
  /// SampleRow::logprob), and the top_logprobs most probable (decreasing, lower id first among
  /// equals).
  std::vector<double> logprobs;
  std::vector<bool> accepted;               ///< the row's draft was accepted (its token is then the draft)
  std::vector<std::vector<std::pair<int64_t, double>>> top;
};

/// logits [rows.size(), V] (any float dtype, any device; the full vocabulary) -> one choice per
/// row. draft_probs: undefined (drafts are point masses), or [rows.size(), V] the draft
/// model's probabilities q of each row (sampling_probabilities of its logits; rows without a
/// draft: ignored). A row with a draft_token gets `accepted` and, when rejected, the token the
/// rule above draws. Throws std::invalid_argument for a shape mismatch, a draft outside the
/// vocabulary or bad options (validate()).
SampledRows sample_rows(const at::Tensor& logits, const std::vector<SampleRow>& rows,
                        const at::Tensor& draft_probs = {});

/// The logits the rows draw from: `logits` [rows.size(), V] float32 with the repetition
/// penalty and the banned token applied (on the logits' device). Same errors as sample_rows.
at::Tensor processed_logits(const at::Tensor& logits, const std::vector<SampleRow>& rows);

/// The distribution each row draws from, [rows.size(), V] float64 in id order on the logits'
/// device: the renormalised probabilities after the penalty, temperature, top-k and top-p (0
/// for filtered tokens; greedy rows: 1 at their first maximum). Same errors as sample_rows.
at::Tensor sampling_probabilities(const at::Tensor& logits, const std::vector<SampleRow>& rows);

}  // namespace loom::generate
