#include "eval/python_random.h"

namespace loom::eval {

namespace {
constexpr int kN = 624, kM = 397;
constexpr uint32_t kMatrixA = 0x9908b0dfU, kUpper = 0x80000000U, kLower = 0x7fffffffU;
}  // namespace

PythonRandom::PythonRandom(uint32_t seed) {
  // init_genrand(19650218), then init_by_array with the one-word key {seed}.
  state_[0] = 19650218U;
  for (int i = 1; i < kN; ++i) state_[i] = 1812433253U * (state_[i - 1] ^ (state_[i - 1] >> 30)) + i;
  int i = 1;
  for (int k = kN; k > 0; --k) {  // max(N, key length) rounds mixing the key in
    state_[i] = (state_[i] ^ ((state_[i - 1] ^ (state_[i - 1] >> 30)) * 1664525U)) + seed;  // + key[0] + j (j = 0)
    if (++i >= kN) {
      state_[0] = state_[kN - 1];
      i = 1;
    }
  }
  for (int k = kN - 1; k > 0; --k) {
    state_[i] = (state_[i] ^ ((state_[i - 1] ^ (state_[i - 1] >> 30)) * 1566083941U)) - i;
    if (++i >= kN) {
      state_[0] = state_[kN - 1];
      i = 1;
    }
  }
  state_[0] = 0x80000000U;  // the most significant bit is 1: a non-zero initial state
  index_ = kN;
}

uint32_t PythonRandom::next() {
  if (index_ >= kN) {
    for (int k = 0; k < kN; ++k) {
      const uint32_t y = (state_[k] & kUpper) | (state_[(k + 1) % kN] & kLower);
      state_[k] = state_[(k + kM) % kN] ^ (y >> 1) ^ ((y & 1U) ? kMatrixA : 0U);
    }
    index_ = 0;
  }
  uint32_t y = state_[index_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680U;
  y ^= (y << 15) & 0xefc60000U;
  y ^= y >> 18;
  return y;
}

double PythonRandom::random() {
  const uint32_t a = next() >> 5, b = next() >> 6;
  return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
}

}  // namespace loom::eval
