// numpy's legacy `numpy.random.RandomState(seed)` as far as Megatron's GPTDataset uses it:
// MT19937 seeded with a 32-bit integer, and `shuffle` of a 1-D array. Same sequence of draws
// as numpy, so Loom builds the same document and shuffle indices as megatron-core.
// Source followed: numpy/random/mtrand.pyx (RandomState.shuffle -> _shuffle_raw) and
// numpy/random/src/distributions/distributions.c (random_interval).
#pragma once
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace loom::data {

class NumpyRandomState {
 public:
  /// numpy accepts seeds in [0, 2^32 - 1]; Megatron passes the configured seed.
  explicit NumpyRandomState(uint32_t seed) : mt_(seed) {}

  /// Uniform integer in [0, max]: mask to the next power of two minus one and reject values
  /// above max (32-bit draws when max < 2^32, else 64-bit draws = high word first).
  uint64_t random_interval(uint64_t max);

  /// Fisher-Yates from the back: for i = n-1 .. 1 swap x[i] with x[random_interval(i)].
  template <class T>
  void shuffle(std::vector<T>& x) {
    for (size_t i = x.size(); i-- > 1;) {
      const auto j = static_cast<size_t>(random_interval(i));
      std::swap(x[i], x[j]);
    }
  }

  uint32_t next_uint32() { return static_cast<uint32_t>(mt_()); }

 private:
  std::mt19937 mt_;  // the standard MT19937; init_genrand seeding equals numpy's mt19937_seed
};

}  // namespace loom::data
