// Philox4x32-10 against the Random123 known-answer vectors, and the dropout keying rules.
#include <catch2/catch.hpp>

#include <stdexcept>

#include "loom_ops/dropout_layout.h"
#include "loom_ops/ops.h"
#include "loom_ops/philox.h"

using loom::ops::PhiloxBlock;

TEST_CASE("philox4x32-10 matches the Random123 known-answer vectors", "[ops][philox]") {
  // Random123 kat_vectors, lines "philox4x32 10 <ctr x4> <key x2> <expected x4>".
  struct Kat {
    PhiloxBlock ctr;
    uint32_t key[2];
    PhiloxBlock want;
  };
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, {0, 0}, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
      {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
       {0xffffffffu, 0xffffffffu},
       {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
      {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
       {0xa4093822u, 0x299f31d0u},
       {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
  };
  for (const auto& k : kats) {
    const PhiloxBlock got = loom::ops::philox4x32_10(k.ctr, k.key[0], k.key[1]);
    for (int i = 0; i < 4; ++i) CHECK(got.v[i] == k.want.v[i]);
  }
}

TEST_CASE("dropout words follow the documented counter/key packing", "[ops][philox]") {
  // counter = (lo(g/4), hi(g/4), lo(stream), hi(stream)), key = (lo(seed), hi(seed)): the
  // third KAT vector read back through dropout_words.
  const uint64_t seed = (uint64_t{0x299f31d0u} << 32) | 0xa4093822u;
  const uint64_t stream = (uint64_t{0x03707344u} << 32) | 0x13198a2eu;
  const uint64_t quad = (uint64_t{0x85a308d3u} << 32) | 0x243f6a88u;
  const PhiloxBlock w = loom::ops::dropout_words(seed, stream, quad);
  CHECK(w.v[0] == 0xd16cfe09u);
  CHECK(w.v[3] == 0x24126ea1u);
  // Element g uses word g % 4 of block g / 4: with seed 0 and stream 0, elements 0..3 get
  // the words of the all-zero KAT vector (6627e8d5 e169c58d bc57ac4c 9b00dbd8).
  const uint64_t thr = uint64_t{0xbc57ac4cu} + 1;  // keeps exactly the words <= 0xbc57ac4c
  CHECK(loom::ops::dropout_keep(0, 0, 2, thr));
  CHECK_FALSE(loom::ops::dropout_keep(0, 0, 2, thr - 1));
  CHECK_FALSE(loom::ops::dropout_keep(0, 0, 1, thr));  // 0xe169c58d
  CHECK(loom::ops::dropout_keep(0, 0, 0, thr));        // 0x6627e8d5
  CHECK(loom::ops::dropout_keep(0, 0, 3, thr));        // 0x9b00dbd8
}

TEST_CASE("keep threshold and scale at the ends of [0, 1]", "[ops][philox]") {
  CHECK(loom::ops::dropout_keep_threshold(0.0) == (uint64_t{1} << 32));
  CHECK(loom::ops::dropout_keep_threshold(1.0) == 0);
  CHECK(loom::ops::dropout_keep_threshold(0.5) == (uint64_t{1} << 31));
  CHECK(loom::ops::dropout_keep_threshold(0.75) == (uint64_t{1} << 30));
  CHECK(loom::ops::dropout_scale(0.0) == 1.0f);
  CHECK(loom::ops::dropout_scale(0.75) == 4.0f);
  CHECK(loom::ops::dropout_scale(1.0) == 0.0f);
}

TEST_CASE("dropout streams pack (step, layer, site) without collisions", "[ops][philox]") {
  CHECK(loom::ops::make_dropout_stream(0, 0, 0) == 0);
  CHECK(loom::ops::make_dropout_stream(1, 0, 0) == (uint64_t{1} << 24));
  CHECK(loom::ops::make_dropout_stream(0, 1, 0) == 256);
  CHECK(loom::ops::make_dropout_stream(0, 0, 3) == 3);
  CHECK(loom::ops::make_dropout_stream(5, 65535, 255) == ((uint64_t{5} << 24) | 0xFFFFFFu));
  CHECK_THROWS_AS(loom::ops::make_dropout_stream(uint64_t{1} << 40, 0, 0), std::invalid_argument);
  CHECK_THROWS_AS(loom::ops::make_dropout_stream(0, 65536, 0), std::invalid_argument);
  CHECK_THROWS_AS(loom::ops::make_dropout_stream(0, 0, 256), std::invalid_argument);
  CHECK_THROWS_AS(loom::ops::make_dropout_stream(0, -1, 0), std::invalid_argument);
}

TEST_CASE("element layouts map local coordinates to global indices", "[ops][philox]") {
  // Local [2, 3, 4] at offset [5, 1, 0] of global [8, 6, 4].
  const auto l = loom::ops::make_element_layout({2, 3, 4}, {8, 6, 4}, {5, 1, 0});
  CHECK(l.ndim == 3);
  CHECK(l.row_length() == 4);
  CHECK(l.base == (5 * 6 + 1) * 4);
  // Row 4 = local (1, 1): global (6, 2, 0) -> (6*6 + 2)*4.
  CHECK(l.row_start(4) == (6 * 6 + 2) * 4);
  // Whole tensor.
  const auto w = loom::ops::make_element_layout({3, 5}, {}, {});
  CHECK(w.base == 0);
  CHECK(w.row_start(2) == 10);
  // Errors name the dimension.
  try {
    loom::ops::make_element_layout({2, 3, 4}, {8, 3, 4}, {0, 1, 0});
    FAIL("expected an error");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("dimension 1") != std::string::npos);
  }
  CHECK_THROWS_AS(loom::ops::make_element_layout({2, 3}, {8, 3, 4}, {0, 0, 0}), std::invalid_argument);
  CHECK_THROWS_AS(loom::ops::make_element_layout({2, 3}, {}, {1, 0}), std::invalid_argument);
  CHECK_THROWS_AS(loom::ops::make_element_layout({1, 1, 1, 1, 1, 1, 1}, {}, {}), std::invalid_argument);
}

TEST_CASE("the CUDA kernels' 8-element keep bits equal the scalar definition", "[ops][philox]") {
  // dropout_keep_bits8 is what every CUDA dropout kernel evaluates; check it on the host
  // for every alignment of the first element within a block of 4 words.
  for (double p : {0.0, 0.1, 0.5, 0.9, 1.0}) {
    const uint64_t thr = loom::ops::dropout_keep_threshold(p);
    for (uint64_t g = 0; g < 64; ++g) {
      for (uint64_t base : {uint64_t{0}, (uint64_t{1} << 40) + 3}) {
        const uint32_t bits = loom::ops::dropout_keep_bits8(17, 23, base + g, thr);
        for (int e = 0; e < 8; ++e)
          CHECK(((bits >> e) & 1u) == (loom::ops::dropout_keep(17, 23, base + g + e, thr) ? 1u : 0u));
      }
    }
  }
}
