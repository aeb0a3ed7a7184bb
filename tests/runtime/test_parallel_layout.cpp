// Rank layout arithmetic against docs/design/parallel_layout.md's formula and its worked example.
#include <catch2/catch.hpp>

#include "runtime/parallel_layout.h"

using loom::runtime::ParallelLayout;
using Groups = std::vector<std::vector<int>>;

TEST_CASE("the worked example of docs/design/parallel_layout.md: world 16, t=2, d=4, p=2", "[layout]") {
  ParallelLayout l(16, 2, 2);
  CHECK(l.data_parallel() == 4);
  CHECK(l.all_tensor_groups() == Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7},
                                        {8, 9}, {10, 11}, {12, 13}, {14, 15}});
  CHECK(l.all_data_groups() == Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}});
  CHECK(l.all_pipeline_groups() == Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11},
                                          {4, 12}, {5, 13}, {6, 14}, {7, 15}});
  CHECK(l.model_parallel_group(0) == std::vector<int>{0, 1, 8, 9});
  CHECK(l.model_parallel_group(11) == std::vector<int>{2, 3, 10, 11});
  CHECK(l.embedding_group(9) == std::vector<int>{1, 9});
}

TEST_CASE("embedding group is the first and last stage", "[layout]") {
  ParallelLayout l(8, 1, 4);  // d = 2; pipelines {0,2,4,6} and {1,3,5,7}
  CHECK(l.pipeline_group(4) == std::vector<int>{0, 2, 4, 6});
  CHECK(l.embedding_group(4) == std::vector<int>{0, 6});
  CHECK(l.embedding_group(7) == std::vector<int>{1, 7});
  ParallelLayout flat(4, 2, 1);
  CHECK(flat.embedding_group(3) == std::vector<int>{3});
}

TEST_CASE("coords and rank_of are inverse and follow tp-dp-pp order", "[layout]") {
  for (auto [w, t, p] : {std::tuple{8, 2, 2}, {8, 4, 1}, {8, 1, 4}, {8, 2, 1}, {12, 3, 2}}) {
    ParallelLayout l(w, t, p);
    const int d = w / (t * p);
    for (int r = 0; r < w; ++r) {
      auto c = l.coords(r);
      CHECK(r == c.tp + t * (c.dp + d * c.pp));
      CHECK(l.rank_of(c) == r);
    }
  }
}

TEST_CASE("sizes that do not divide or are not positive are refused by name", "[layout]") {
  CHECK_THROWS_WITH(ParallelLayout(6, 4, 1), Catch::Contains("not divisible"));
  CHECK_THROWS_WITH(ParallelLayout(8, 0, 1), Catch::Contains("tensor_model_parallel_size"));
  CHECK_THROWS_WITH(ParallelLayout(8, 2, -1), Catch::Contains("pipeline_model_parallel_size"));
  CHECK_THROWS_WITH(ParallelLayout(0, 1, 1), Catch::Contains("world size"));
}
