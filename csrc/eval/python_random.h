// Python's `random.Random(seed)` for an integer seed: the Mersenne Twister MT19937
// (Matsumoto & Nishimura 1998) seeded with init_by_array([seed]) as CPython does, random()
// with its 53-bit recipe and choices(k=n) without weights as floor(random()·n). Exact to the
// bit, so that the bootstrap standard errors lm-evaluation-harness reports
// (api/metrics.py bootstrap_stderr: chunk i of 1000 draws uses Random(i)) come out the same.
#pragma once
#include <array>
#include <cstdint>

namespace loom::eval {

class PythonRandom {
 public:
  /// random.Random(seed) for 0 <= seed < 2^32.
  explicit PythonRandom(uint32_t seed);
  /// random.random(): a double in [0, 1) from two 32-bit outputs.
  double random();
  /// One draw of random.choices(population of size n): floor(random() * n).
  int64_t choice_index(int64_t n) { return static_cast<int64_t>(random() * static_cast<double>(n)); }

 private:
  uint32_t next();
  std::array<uint32_t, 624> state_{};
  int index_ = 624;
};

}  // namespace loom::eval
