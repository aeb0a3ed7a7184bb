// The shard content hash (train/checkpoint_files.h, fnv1a64; fnv1a64.cpp computes it 512 bytes
// at a time on AVX-512 CPUs) is exactly the byte-wise hash Loom has always written: FNV-1a's
// xor-multiply with the 64-bit prime, from Loom's offset basis 1469598103934665603 (one digit
// short of FNV's 14695981039346656037; docs/design/formats.md). Pinned values, and the byte-wise
// form over random, constant and every-length inputs at unaligned starts, so checkpoints written
// before the blocked form keep their hashes.
#include <catch2/catch.hpp>

#include <cstdint>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "train/checkpoint_files.h"

using loom::train::fnv1a64;

namespace {

uint64_t reference(const unsigned char* data, size_t size) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 0x100000001b3ull;
  return h;
}

}  // namespace

TEST_CASE("fnv1a64 gives the values Loom's checkpoints record") {
  auto of = [](const std::string& s) { return fnv1a64(s.data(), s.size()); };
  CHECK(of("") == 0x14650fb0739d0383ull);
  CHECK(of("a") == 0x44bd8ad473cd9906ull);
  CHECK(of("foobar") == 0x88fad7c0a8ff07f2ull);
  // 600 bytes: one blocked step and a byte-wise tail on AVX-512 CPUs.
  CHECK(of(std::string(600, 'x')) == 0x75e91438198d2c23ull);
}

TEST_CASE("fnv1a64 equals the byte-wise hash at every length, start and content") {
  std::mt19937_64 rng(20261204);
  std::vector<unsigned char> random(3 * 4096 + 77);
  for (auto& c : random) c = static_cast<unsigned char>(rng());
  const std::vector<unsigned char> zeros(5000, 0x00), ones(5000, 0xFF);
  for (const auto* bytes : std::initializer_list<const std::vector<unsigned char>*>{&random, &zeros, &ones}) {
    for (size_t start : {0, 1, 3, 63}) {
      for (size_t size = 0; start + size <= bytes->size(); size += size < 1100 ? 1 : 997) {
        const unsigned char* p = bytes->data() + start;
        if (fnv1a64(reinterpret_cast<const char*>(p), size) != reference(p, size)) {
          FAIL("differs at start " << start << ", size " << size);
        }
      }
    }
  }
  // A long input with every byte value: many 512-byte steps carried into each other.
  std::vector<unsigned char> long_input(1 << 20);
  for (auto& c : long_input) c = static_cast<unsigned char>(rng() >> 11);
  CHECK(fnv1a64(reinterpret_cast<const char*>(long_input.data()), long_input.size()) ==
        reference(long_input.data(), long_input.size()));
}
