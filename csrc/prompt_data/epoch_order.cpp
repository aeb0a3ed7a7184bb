#include "prompt_data/epoch_order.h"

#include <random>
#include <stdexcept>
#include <string>
#include <utility>

namespace loom::prompt_data {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Uniform in [0, range) for range >= 1: rejects the lowest 2^64 mod range outputs, so the
// accepted ones are a whole number of copies of [0, range).
uint64_t below(std::mt19937_64& rng, uint64_t range) {
  const uint64_t threshold = (0 - range) % range;
  for (;;) {
    const uint64_t r = rng();
    if (r >= threshold) return r % range;
  }
}

}  // namespace

EpochOrder::EpochOrder(int64_t num_examples, uint64_t seed, bool shuffle)
    : n_(num_examples), seed_(seed), shuffle_(shuffle) {
  if (num_examples < 1) {
    throw std::invalid_argument("EpochOrder: " + std::to_string(num_examples) + " examples; expected at least 1");
  }
}

std::vector<int64_t> EpochOrder::permutation(int64_t epoch) const {
  std::vector<int64_t> p(static_cast<size_t>(n_));
  for (int64_t i = 0; i < n_; ++i) p[static_cast<size_t>(i)] = i;
  if (!shuffle_) return p;
  std::mt19937_64 rng(splitmix64(splitmix64(seed_) ^ static_cast<uint64_t>(epoch)));
  for (int64_t i = n_ - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(below(rng, static_cast<uint64_t>(i) + 1));
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(j)]);
  }
  return p;
}

int64_t EpochOrder::operator[](int64_t i) const {
  if (i < 0) throw std::out_of_range("EpochOrder: stream index " + std::to_string(i) + " < 0");
  const int64_t e = i / n_;
  if (e != cached_epoch_) {
    cached_ = permutation(e);
    cached_epoch_ = e;
  }
  return cached_[static_cast<size_t>(i % n_)];
}

}  // namespace loom::prompt_data
