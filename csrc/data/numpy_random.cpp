#include "data/numpy_random.h"

namespace loom::data {

uint64_t NumpyRandomState::random_interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  mask |= mask >> 32;
  uint64_t value;
  if (max <= 0xFFFFFFFFull) {
    while ((value = (next_uint32() & mask)) > max) {
    }
  } else {
    do {
      const uint64_t hi = next_uint32();
      const uint64_t lo = next_uint32();
      value = ((hi << 32) | lo) & mask;
    } while (value > max);
  }
  return value;
}

}  // namespace loom::data
