// numpy RandomState(seed).shuffle reproduced bit for bit. Expected values printed by numpy 2.3.5:
//   r = numpy.random.RandomState(1234); a = numpy.arange(10, dtype=numpy.int32); r.shuffle(a)
//   r = numpy.random.RandomState(7); a = numpy.arange(100000, dtype=numpy.uint32); r.shuffle(a)
#include <catch2/catch.hpp>

#include <numeric>

#include "data/numpy_random.h"

using loom::data::NumpyRandomState;

TEST_CASE("RandomState.shuffle matches numpy", "[numpy]") {
  NumpyRandomState r(1234);
  std::vector<int32_t> a(10);
  std::iota(a.begin(), a.end(), 0);
  r.shuffle(a);
  CHECK(a == std::vector<int32_t>{7, 2, 9, 1, 0, 8, 4, 5, 6, 3});

  NumpyRandomState r7(7);
  std::vector<int64_t> b(100000);
  std::iota(b.begin(), b.end(), 0);
  r7.shuffle(b);
  CHECK(std::vector<int64_t>(b.begin(), b.begin() + 8) ==
        std::vector<int64_t>{33909, 92307, 89107, 9538, 31008, 71305, 71012, 62938});
  CHECK(std::vector<int64_t>(b.end() - 3, b.end()) == std::vector<int64_t>{49689, 58564, 61615});
}

TEST_CASE("MT19937 stream equals the reference generator", "[numpy]") {
  // The 10000th output of MT19937 seeded with 5489 is 4123659995 (C++ standard, [rand.predef]).
  NumpyRandomState r(5489);
  uint32_t x = 0;
  for (int i = 0; i < 10000; ++i) x = r.next_uint32();
  CHECK(x == 4123659995u);
  NumpyRandomState z(3);
  CHECK(z.random_interval(0) == 0);
  for (int i = 0; i < 1000; ++i) CHECK(z.random_interval(5) <= 5);
}
