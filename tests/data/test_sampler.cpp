// MegatronPretrainingSampler semantics: consecutive ids per step, cut per data-parallel rank,
// resumable from consumed_samples.
#include <catch2/catch.hpp>

#include "data/data_error.h"
#include "data/pretraining_sampler.h"

using loom::data::PretrainingSampler;

TEST_CASE("each DP rank gets its slice of every step", "[sampler]") {
  // micro batch 2, dp 3: step 0 covers ids 0..5 -> rank0 {0,1}, rank1 {2,3}, rank2 {4,5}.
  std::vector<std::vector<int64_t>> seen;
  for (int r = 0; r < 3; ++r) {
    PretrainingSampler s(20, 0, 2, r, 3);
    auto a = s.next();
    auto b = s.next();
    REQUIRE(a);
    REQUIRE(b);
    CHECK(*a == std::vector<int64_t>{2 * r, 2 * r + 1});
    CHECK(*b == std::vector<int64_t>{6 + 2 * r, 6 + 2 * r + 1});
    CHECK(s.consumed_samples() == 12);
    CHECK(s.next());           // ids 12..17
    CHECK_FALSE(s.next());     // 2 left < 6: dropped
  }
  PretrainingSampler keep(20, 12, 2, 1, 3, /*drop_last=*/false);
  CHECK(*keep.next() == std::vector<int64_t>{14, 15});
  CHECK(*keep.next() == std::vector<int64_t>{});  // partial step 18..19: rank 1 gets nothing
  CHECK_FALSE(keep.next());
}

TEST_CASE("resuming from consumed_samples continues the same stream", "[sampler]") {
  PretrainingSampler full(100, 0, 4, 1, 2);
  std::vector<std::vector<int64_t>> all;
  while (auto b = full.next()) all.push_back(*b);
  REQUIRE(all.size() == 12);
  PretrainingSampler resumed(100, 5 * 8, 4, 1, 2);
  for (size_t i = 5; i < all.size(); ++i) CHECK(*resumed.next() == all[i]);
  CHECK_FALSE(resumed.next());
}

TEST_CASE("sampler arguments are validated", "[sampler][errors]") {
  using loom::data::DataError;
  CHECK_THROWS_AS(PretrainingSampler(0, 0, 1, 0, 1), DataError);
  CHECK_THROWS_WITH(PretrainingSampler(10, 10, 1, 0, 1), Catch::Contains("consumed_samples 10"));
  CHECK_THROWS_AS(PretrainingSampler(10, 0, 0, 0, 1), DataError);
  CHECK_THROWS_AS(PretrainingSampler(10, 0, 1, 2, 2), DataError);
}
