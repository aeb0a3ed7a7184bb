// The planner reproduces published A100-80GB results with the built-in profile (docs/design/planner_sources.md):
// Korthikanti et al. 2022 iteration times and Narayanan et al. 2021 TFLOP/s per GPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <set>

#include "planner/validation.h"

using namespace loom::planner;

TEST_CASE("published results reproduced within 5% mean and 10% worst error", "[planner]") {
  const GpuSpec gpu = find_gpu("A100-80GB");
  const auto checks = check_published(gpu, true);
  std::cout << format_checks(checks);
  REQUIRE(checks.size() == 18);
  double sum = 0, worst = 0;
  for (const auto& c : checks) {
    INFO(c.row.source << " " << c.row.label);
    // The published layout must fit in memory by the planner's own model.
    CHECK(c.published_fits);
    sum += std::abs(c.relative_error);
    worst = std::max(worst, std::abs(c.relative_error));
    // The planner's best layout for the same model, GPUs and batch is at least as fast.
    REQUIRE(c.planner_best.step_seconds() > 0);
    CHECK(c.planner_best.step_seconds() <= c.published_layout.step_seconds() * (1 + 1e-12));
    CHECK(c.planner_best.fits);
  }
  CHECK(sum / checks.size() <= 0.05);
  CHECK(worst <= 0.10);
}

TEST_CASE("published rows carry the configurations of the papers", "[planner]") {
  const auto rows = published_rows();
  std::set<std::string> sources;
  for (const auto& r : rows) {
    sources.insert(r.source);
    CHECK(r.gpus % (r.tp * r.pp) == 0);
    CHECK(r.shape.num_layers % r.pp == 0);
  }
  CHECK(sources.size() == 2);
  CHECK(rows[2].label == "175B full recompute");
  CHECK(rows[2].published == 18.13);
  CHECK(rows[2].vp == 3);
  CHECK(rows.back().shape.hidden_size == 25600);
  CHECK(rows.back().published == 163);
}
