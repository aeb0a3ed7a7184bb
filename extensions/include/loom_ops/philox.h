// Philox4x32-10 counter-based random numbers and Loom's dropout keying, shared verbatim by
// the CPU kernels (host) and the CUDA kernels (device): the same source decides every mask
// bit, so CPU and CUDA masks are bit-identical by construction.
//
// Generator: Salmon, Moraes, Dror, Shaw, "Parallel Random Numbers: As Easy as 1, 2, 3"
// (SC'11), Philox4x32 with 10 rounds: multipliers 0xD2511F53, 0xCD9E8D57, Weyl key
// increments 0x9E3779B9, 0xBB67AE85. Checked against the Random123 known-answer vectors
// (tests/ops/test_philox.cpp).
//
// Dropout keying (the contract every Loom dropout follows; see dropout_layout.h):
//   key     = (lo32(seed), hi32(seed))
//   counter = (lo32(g / 4), hi32(g / 4), lo32(stream), hi32(stream))
//   word    = philox4x32_10(counter, key)[g % 4]
//   keep    = word < keep_threshold(p),   keep_threshold(p) = round((1 - p) * 2^32)
// where g is the element's index in the row-major *global* tensor, seed is the run's seed
// and stream names the dropout site (see dropout_stream()). A mask bit is therefore a pure
// function of (seed, stream, g, p): no generator state, nothing to save for recomputation.
// Kept elements are scaled by 1 / (1 - p); p == 1 drops everything (output 0).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define LOOM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define LOOM_HOST_DEVICE inline
#endif

namespace loom::ops {

/// Four 32-bit words: a Philox counter or its output block.
struct PhiloxBlock {
  uint32_t v[4];
};

namespace detail {
constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

LOOM_HOST_DEVICE uint32_t mulhi32(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

LOOM_HOST_DEVICE void philox_round(uint32_t c[4], uint32_t k0, uint32_t k1) {
  const uint32_t hi0 = mulhi32(kPhiloxM0, c[0]);
  const uint32_t lo0 = kPhiloxM0 * c[0];
  const uint32_t hi1 = mulhi32(kPhiloxM1, c[2]);
  const uint32_t lo1 = kPhiloxM1 * c[2];
  const uint32_t n0 = hi1 ^ c[1] ^ k0;
  const uint32_t n2 = hi0 ^ c[3] ^ k1;
  c[0] = n0;
  c[1] = lo1;
  c[2] = n2;
  c[3] = lo0;
}
}  // namespace detail

/// Philox4x32-10 of one counter block under a 64-bit key given as two words.
LOOM_HOST_DEVICE PhiloxBlock philox4x32_10(PhiloxBlock counter, uint32_t key0, uint32_t key1) {
  uint32_t* c = counter.v;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key0 += detail::kPhiloxW0;
      key1 += detail::kPhiloxW1;
    }
    detail::philox_round(c, key0, key1);
  }
  return counter;
}

/// The four random words covering global elements 4*quad .. 4*quad+3 of a dropout site.
LOOM_HOST_DEVICE PhiloxBlock dropout_words(uint64_t seed, uint64_t stream, uint64_t quad) {
  PhiloxBlock c;
  c.v[0] = static_cast<uint32_t>(quad);
  c.v[1] = static_cast<uint32_t>(quad >> 32);
  c.v[2] = static_cast<uint32_t>(stream);
  c.v[3] = static_cast<uint32_t>(stream >> 32);
  return philox4x32_10(c, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

/// Keep threshold for drop probability p in [0, 1]: a word w keeps its element iff
/// w < threshold. p = 0 gives 2^32 (keep all), p = 1 gives 0 (drop all). Computed on the
/// host in double and passed to kernels as an integer, so every device compares the same
/// integers.
inline uint64_t dropout_keep_threshold(double p) {
  if (!(p > 0.0)) return uint64_t{1} << 32;
  if (p >= 1.0) return 0;
  const double t = (1.0 - p) * 4294967296.0;
  return static_cast<uint64_t>(t + 0.5);
}

/// Scale applied to kept elements: 1 / (1 - p), or 0 when p == 1 (everything dropped).
inline float dropout_scale(double p) {
  return p >= 1.0 ? 0.0f : static_cast<float>(1.0 / (1.0 - p));
}

/// The mask bit of global element g (the scalar definition; kernels batch 4 words a call).
LOOM_HOST_DEVICE bool dropout_keep(uint64_t seed, uint64_t stream, uint64_t g,
                                   uint64_t threshold) {
  const PhiloxBlock w = dropout_words(seed, stream, g >> 2);
  return static_cast<uint64_t>(w.v[g & 3]) < threshold;
}

/// Keep bits of the 8 consecutive global elements g .. g+7 (bit e for element g + e), in at
/// most three Philox calls; the CUDA kernels' batched form of dropout_keep.
LOOM_HOST_DEVICE uint32_t dropout_keep_bits8(uint64_t seed, uint64_t stream, uint64_t g,
                                             uint64_t threshold) {
  if (threshold > 0xFFFFFFFFull) return 0xFFu;  // p == 0: keep all
  const uint64_t q0 = g >> 2;
  const int lane0 = static_cast<int>(g & 3);
  uint32_t bits = 0;
  for (int k = 0; k < 3; ++k) {
    if (k == 2 && lane0 == 0) break;  // an aligned start needs two blocks of 4 words
    const PhiloxBlock w = dropout_words(seed, stream, q0 + k);
    for (int l = 0; l < 4; ++l) {
      const int e = 4 * k + l - lane0;
      if (e >= 0 && e < 8 && static_cast<uint64_t>(w.v[l]) < threshold) bits |= 1u << e;
    }
  }
  return bits;
}

/// Dropout sites of a GPT layer, the low byte of a stream (see dropout_stream()).
enum DropoutSite : uint32_t {
  kDropoutSiteEmbedding = 0,        ///< embedding output, [s, b, h]
  kDropoutSiteAttentionProbs = 1,   ///< attention probabilities, [b, a, s, s]
  kDropoutSiteAttentionOutput = 2,  ///< after the attention projection, [s, b, h]
  kDropoutSiteMlpOutput = 3,        ///< after the MLP, [s, b, h]
};

/// Packs (step, layer, site) into a 64-bit stream: step << 24 | layer << 8 | site, with
/// step < 2^40 (training iteration), layer < 2^16 (global layer number, not the local one
/// of a pipeline stage), site < 2^8. Different triples never share a stream. The caller
/// checks the ranges (loom::ops::make_dropout_stream in ops.h does and throws).
LOOM_HOST_DEVICE uint64_t dropout_stream(uint64_t step, uint32_t layer, uint32_t site) {
  return (step << 24) | (static_cast<uint64_t>(layer & 0xFFFFu) << 8) | (site & 0xFFu);
}

}  // namespace loom::ops
