#include "generate/sampling.h"

#include <cmath>
#include <stdexcept>
#include <string>

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

TokenSampler::TokenSampler(const SamplingOptions& options) : options_(options), rng_(options.seed) {
  validate(options_);
}

double TokenSampler::draw_uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

}  // namespace loom::generate
