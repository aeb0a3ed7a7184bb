// The options that choose the next token from the logits of the whole (unpadded)
// vocabulary: greedy, or a draw from softmax(logits / temperature) restricted to the top-k
// tokens and then to the nucleus (top-p, Holtzman et al. 2019: the smallest set of most
// probable tokens whose probability reaches p), renormalised. The order of the filters is
// Megatron's and Hugging Face's (temperature, top-k, top-p); the rules themselves are
// generate/sampling_batch.h's. Torch-free: the options, their checks and a request's seeded
// uniforms.
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

/// Throws std::invalid_argument naming the option (--temperature, --top-k, --top-p,
/// --repetition-penalty) when it is out of range.
void validate(const SamplingOptions& options);

/// A request's seeded source of uniforms: the rules that turn logits and a uniform into a
/// token live in one place, generate/sampling_batch.h (sample_rows), for `loom generate` and
/// the serving engine alike.
class TokenSampler {
 public:
  /// Validates `options` (see validate()).
  explicit TokenSampler(const SamplingOptions& options);

  /// The next uniform u in [0, 1) (53 random bits of std::mt19937_64 seeded with the options'
  /// seed): a sampled (not greedy) token draws one, the i-th generated token the i-th.
  double draw_uniform();

 private:
  SamplingOptions options_;
  std::mt19937_64 rng_;
};

}  // namespace loom::generate
