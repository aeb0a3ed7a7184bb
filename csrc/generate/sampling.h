// Choosing the next token from the logits of the whole (unpadded) vocabulary: greedy, or a
// draw from softmax(logits / temperature) restricted to the top-k tokens and then to the
// nucleus (top-p, Holtzman et al. 2019: the smallest set of most probable tokens whose
// probability reaches p), renormalised. The order of the filters is Megatron's and Hugging
// Face's (temperature, top-k, top-p). Torch-free; every rank that feeds the same logits to a
// sampler built with the same options draws the same tokens.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace loom::generate {

struct SamplingOptions {
  bool greedy = false;       ///< argmax (the lowest id among equal maxima); ignores the rest
  double temperature = 1.0;  ///< > 0; logits are divided by it
  int64_t top_k = 0;         ///< 0: no limit; 1 is greedy
  double top_p = 1.0;        ///< in (0, 1]; 1: no nucleus filter
  uint64_t seed = 1234;      ///< seeds the generator (std::mt19937_64)
  /// > 0; 1: off. Applied before every filter (greedy too) to the tokens of the context so far
  /// (prompt and generated), with Hugging Face's rule (Keskar et al. 2019, CTRL): a positive
  /// logit is divided by it, a negative one multiplied.
  double repetition_penalty = 1.0;
};

/// Applies `penalty` (see SamplingOptions::repetition_penalty) to logits[id] of every distinct
/// id of `seen` in [0, n).
void apply_repetition_penalty(float* logits, int64_t n, const std::vector<int64_t>& seen, double penalty);

/// Throws std::invalid_argument naming the option (--temperature, --top-k, --top-p,
/// --repetition-penalty) when it is out of range.
void validate(const SamplingOptions& options);

class TokenSampler {
 public:
  /// Validates `options` (see validate()).
  explicit TokenSampler(const SamplingOptions& options);

  /// The next token id in [0, n) for logits[0..n). Greedy draws no random number; otherwise
  /// exactly one uniform u in [0, 1) (53 random bits) is drawn per call and the token is the
  /// first, in order of decreasing probability (ties: lower id first), whose cumulative
  /// renormalised probability exceeds u. Throws std::invalid_argument when n == 0 or a logit
  /// is NaN.
  int64_t next(const float* logits, int64_t n);
  int64_t next(const std::vector<float>& logits) {
    return next(logits.data(), static_cast<int64_t>(logits.size()));
  }

  /// One step of generation, as `loom generate` and the serving engine take it: the
  /// repetition penalty (the options') over `context` (the prompt and the tokens generated so
  /// far), `stop_token` held back (logit -inf) while fewer than `min_new_tokens` of the
  /// `generated` tokens exist (a stop_token outside [0, n): none), then next(). Changes
  /// logits[0..n) in place. Throws what next() throws.
  int64_t next_token(float* logits, int64_t n, const std::vector<int64_t>& context, int64_t generated,
                     int64_t stop_token, int64_t min_new_tokens);

  /// The uniform u in [0, 1) (53 random bits) next() draws for a sampled (not greedy) token,
  /// advancing the generator as next() does: the batched sampler (sampling_batch.h) draws each
  /// request's u here, on the host, so a request's tokens do not depend on how it is sampled.
  double draw_uniform();

  /// The renormalised probabilities next() would draw from (0 for filtered tokens); for tests.
  std::vector<double> distribution(const float* logits, int64_t n) const;

 private:
  // Candidates in draw order and their renormalised probabilities.
  void candidates(const float* logits, int64_t n, std::vector<int64_t>& ids,
                  std::vector<double>& probs) const;
  SamplingOptions options_;
  std::mt19937_64 rng_;
};

}  // namespace loom::generate
