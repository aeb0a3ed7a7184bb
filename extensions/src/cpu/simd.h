// fp32 vectors as GCC vector types, for kernel bodies compiled once per ISA (isa.h). A body is
// a template on the vector type and each ISA's function instantiates it at that ISA's register
// width (Vec<16> for AVX-512, Vec<8> for AVX2, Vec<4> for the SSE2 baseline): wider than the
// registers, GCC spills the vectors to the stack. Everything here is always-inline so that it
// takes the ISA of the function it lands in.
#pragma once

#include <cstdint>
#include <cstring>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"  // the types never cross a call: all is inlined

namespace loom::ops::cpu {

#define LOOM_VEC_INLINE __attribute__((always_inline)) inline

// (Explicit types per width: GCC drops vector_size from an alias template with a dependent size.)
template <int kWidth>
struct VecTypes;
template <>
struct VecTypes<16> {
  typedef float Float __attribute__((vector_size(64)));
  typedef int32_t Int __attribute__((vector_size(64)));
};
template <>
struct VecTypes<8> {
  typedef float Float __attribute__((vector_size(32)));
  typedef int32_t Int __attribute__((vector_size(32)));
};
template <>
struct VecTypes<4> {
  typedef float Float __attribute__((vector_size(16)));
  typedef int32_t Int __attribute__((vector_size(16)));
};
template <int kWidth>
using Vec = typename VecTypes<kWidth>::Float;

template <typename V>
constexpr int64_t lanes = sizeof(V) / sizeof(float);

template <typename V>
LOOM_VEC_INLINE V splat(float x) { return V{} + x; }
template <typename V>
LOOM_VEC_INLINE V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);  // an unaligned vector load
  return v;
}
template <typename V>
LOOM_VEC_INLINE void store(float* p, V v) { std::memcpy(p, &v, sizeof v); }
template <typename V>
LOOM_VEC_INLINE V max(V a, V b) { return a > b ? a : b; }

/// The sum of the lanes, as a tree of halves.
template <typename V>
LOOM_VEC_INLINE float sum_lanes(V v) {
  if constexpr (lanes<V> == 16) {
    return sum_lanes(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                     __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
  } else if constexpr (lanes<V> == 8) {
    return sum_lanes(__builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7));
  } else {
    static_assert(lanes<V> == 4);
    return (v[0] + v[2]) + (v[1] + v[3]);
  }
}

template <typename V>
LOOM_VEC_INLINE float max_lanes(V v) {
  float m = v[0];
  for (int i = 1; i < lanes<V>; ++i) m = m > v[i] ? m : v[i];
  return m;
}

/// e^x per lane, within 3 ulp of expf for x in [-87.3, 88]: x = n ln2 + r with |r| <= ln2 / 2
/// (Cody-Waite split of ln2), e^r by its degree-6 Taylor polynomial (truncation < 1.7e-7
/// relative), 2^n put in the exponent bits. x above 88 gives e^88; x below -87.3 (where expf
/// turns subnormal) and -inf give 0; NaN stays NaN.
template <typename V>
LOOM_VEC_INLINE V exp(V x) {
  using Int = typename VecTypes<lanes<V>>::Int;
  const V underflow = x < splat<V>(-87.3f) ? splat<V>(0.0f) : splat<V>(1.0f);
  x = x > splat<V>(88.0f) ? splat<V>(88.0f) : x;
  x = x < splat<V>(-87.3f) ? splat<V>(-87.3f) : x;
  // Round x / ln2 to the nearest integer by adding 1.5 * 2^23 (exact for |x / ln2| < 2^22).
  const V shifter = splat<V>(12582912.0f);
  const V n = (x * splat<V>(1.44269504088896341f) + shifter) - shifter;
  const V r = (x - n * splat<V>(0.693359375f)) + n * splat<V>(2.12194440e-4f);  // ln2 = 0.693359375 - 2.12194440e-4
  V p = splat<V>(1.0f / 720);
  p = p * r + splat<V>(1.0f / 120);
  p = p * r + splat<V>(1.0f / 24);
  p = p * r + splat<V>(1.0f / 6);
  p = p * r + splat<V>(0.5f);
  p = p * r + splat<V>(1.0f);
  p = p * r + splat<V>(1.0f);
  const Int biased = (__builtin_convertvector(n, Int) + 127) << 23;  // 2^n, n in [-126, 127]
  return p * (V)biased * underflow;  // a vector cast keeps the bits
}

}  // namespace loom::ops::cpu

#pragma GCC diagnostic pop
