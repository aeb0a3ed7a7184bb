// fnv1a64 (train/checkpoint_files.h): the content hash of every checkpoint shard, FNV-1a's
// xor-multiply with the 64-bit prime from Loom's offset basis 1469598103934665603 (one digit
// short of FNV's published 14695981039346656037, kept: every checkpoint records it). Torch-free
// like checkpoint_files.cpp (the fuzz target compiles both).
//
// Byte by byte the hash is one serial xor and multiply per byte (~0.7 GB/s), and a shard of a
// 124M-parameter run with its Adam state is 2 GB. On CPUs with AVX-512 the same value is
// computed 512 bytes at a time (measured 2.2x faster); elsewhere, and for the tail, byte-wise.
//
// Why the blocked form is exact: with lo = h mod 256, h ^ b = h + d where d = (lo ^ b) - lo,
// so h' = (h ^ b) * P = P * h + P * d is linear in h once every position's lo is known, and
// h after n bytes = P^n * h0 + sum_i P^(n-i) * d_i. The low bytes follow their own chain
// lo' = ((lo ^ b) * P) mod 256, and since P is odd, bit j of lo' is lo_j ^ b_j ^ (bit j of
// (((lo ^ b) mod 2^j) * P)): given bit planes 0..j-1 at every position, plane j is a prefix XOR
// (a carry-less multiplication by all ones), carried from block to block by its parity.
#include "train/checkpoint_files.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace loom::train {
namespace {

constexpr uint64_t kOffsetBasis = 1469598103934665603ull;
constexpr uint64_t kPrime = 1099511628211ull;

uint64_t bytewise(uint64_t h, const unsigned char* data, size_t size) {
  for (size_t i = 0; i < size; ++i) {
    h ^= data[i];
    h *= kPrime;
  }
  return h;
}

#if defined(__x86_64__)
constexpr int kBlocks = 8;                // 64-byte blocks per step, interleaved for ILP
constexpr size_t kStep = 64 * kBlocks;    // bytes per step

#define LOOM_FNV_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,pclmul,popcnt")))

/// The hash continued from `h` over `steps` * kStep bytes of `data` (see the top of this file).
LOOM_FNV_TARGET uint64_t blocked(uint64_t h, const unsigned char* data, size_t steps) {
  uint64_t power[65];  // P^k
  power[0] = 1;
  for (int k = 1; k <= 64; ++k) power[k] = power[k - 1] * kPrime;
  // acc[r] lane l: sum over blocks of P^(64 * (blocks after it)) * d at position 8r + l.
  __m512i acc[8];
  for (auto& a : acc) a = _mm512_setzero_si512();
  const __m512i p64 = _mm512_set1_epi64(static_cast<long long>(power[64]));
  const __m512i prime_byte = _mm512_set1_epi16(static_cast<short>(kPrime & 0xFF));
  const __m512i even_bytes = _mm512_set1_epi16(0x00FF);
  const __m128i all_ones = _mm_set1_epi64x(-1);
  uint64_t carry = h & 0xFF;  // lo before the step's first byte
  for (size_t s = 0; s < steps; ++s) {
    __m512i b[kBlocks], lo[kBlocks];
    for (int k = 0; k < kBlocks; ++k) {
      b[k] = _mm512_loadu_si512(data + kStep * s + 64 * k);
      lo[k] = _mm512_setzero_si512();
    }
    uint64_t next = 0;
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m512i bit = _mm512_set1_epi8(static_cast<char>(1 << j));
      const __m512i below = _mm512_set1_epi8(static_cast<char>((1 << j) - 1));
      uint64_t flip[kBlocks];  // bit j of lo' ^ bit j of lo, per position
      for (int k = 0; k < kBlocks; ++k) {
        flip[k] = _mm512_test_epi8_mask(b[k], bit);
        if (j > 0) {
          // ((lo ^ b) mod 2^j) * P mod 256 per byte, by 16-bit multiplies of the even and odd bytes.
          const __m512i x = _mm512_and_si512(_mm512_xor_si512(lo[k], b[k]), below);
          const __m512i even = _mm512_mullo_epi16(_mm512_and_si512(x, even_bytes), prime_byte);
          const __m512i odd = _mm512_mullo_epi16(_mm512_andnot_si512(even_bytes, x), prime_byte);
          flip[k] ^= _mm512_test_epi8_mask(_mm512_ternarylogic_epi64(even_bytes, even, odd, 0xCA), bit);
        }
      }
      uint64_t cj = (carry >> j) & 1;
      for (int k = 0; k < kBlocks; ++k) {
        const uint64_t inclusive = static_cast<uint64_t>(_mm_cvtsi128_si64(
            _mm_clmulepi64_si128(_mm_cvtsi64_si128(static_cast<long long>(flip[k])), all_ones, 0x00)));
        lo[k] = _mm512_or_si512(lo[k], _mm512_maskz_mov_epi8((inclusive << 1) ^ (0 - cj), bit));
        cj ^= static_cast<uint64_t>(__builtin_popcountll(flip[k])) & 1;
      }
      next |= cj << j;
    }
    carry = next;
    for (int k = 0; k < kBlocks; ++k) {
      const __m512i x = _mm512_xor_si512(lo[k], b[k]);
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) {
        __m128i x16 = _mm512_extracti32x4_epi32(x, 0), lo16 = _mm512_extracti32x4_epi32(lo[k], 0);
        if (r / 2 == 1) x16 = _mm512_extracti32x4_epi32(x, 1), lo16 = _mm512_extracti32x4_epi32(lo[k], 1);
        if (r / 2 == 2) x16 = _mm512_extracti32x4_epi32(x, 2), lo16 = _mm512_extracti32x4_epi32(lo[k], 2);
        if (r / 2 == 3) x16 = _mm512_extracti32x4_epi32(x, 3), lo16 = _mm512_extracti32x4_epi32(lo[k], 3);
        if (r & 1) x16 = _mm_unpackhi_epi64(x16, x16), lo16 = _mm_unpackhi_epi64(lo16, lo16);
        const __m512i d = _mm512_sub_epi64(_mm512_cvtepu8_epi64(x16), _mm512_cvtepu8_epi64(lo16));
        acc[r] = _mm512_add_epi64(_mm512_mullo_epi64(acc[r], p64), d);
      }
    }
  }
  uint64_t out_power = 1, square = power[64];  // P^(64 * blocks)
  for (size_t e = steps * kBlocks; e; e >>= 1, square *= square)
    if (e & 1) out_power *= square;
  uint64_t out = h * out_power;
  for (int r = 0; r < 8; ++r) {
    alignas(64) uint64_t lanes[8];
    _mm512_store_si512(lanes, acc[r]);
    for (int l = 0; l < 8; ++l) out += lanes[l] * power[64 - (8 * r + l)];
  }
  return out;
}

bool has_blocked() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("popcnt");
  return yes;
}
#endif

}  // namespace

uint64_t fnv1a64(const char* data, size_t size) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(data);
  uint64_t h = kOffsetBasis;
  size_t done = 0;
#if defined(__x86_64__)
  if (size >= kStep && has_blocked()) {
    h = blocked(h, bytes, size / kStep);
    done = size / kStep * kStep;
  }
#endif
  return bytewise(h, bytes + done, size - done);
}

}  // namespace loom::train
