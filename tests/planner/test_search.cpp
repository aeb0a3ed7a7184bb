// Layout search: every returned layout divides and fits; restrictions are honoured; failing
// layouts name their binding term; the 175B / 1024-GPU search time is printed.
#include <catch2/catch.hpp>

#include <iostream>

#include "planner/search.h"

using namespace loom::planner;

namespace {
Cluster cluster(const char* gpu, int nodes) {
  Cluster c;
  c.gpu = find_gpu(gpu);
  c.num_nodes = nodes;
  c.gpus_per_node = 8;
  return c;
}
constexpr double kGiB = 1073741824.0;
}  // namespace

TEST_CASE("every returned layout is valid and fits", "[planner]") {
  const ModelShape m = gpt3_shape_for_size(20);
  const Cluster c = cluster("A100-40GB", 8);
  TrainingSetup setup;
  setup.global_batch = 256;
  const SearchResult r = search(m, c, setup, SearchSpace{}, 500);
  REQUIRE(!r.best.empty());
  CHECK(r.fitting <= r.enumerated);
  CHECK(r.best.size() == std::min<std::size_t>(500, r.fitting));
  for (std::size_t i = 0; i < r.best.size(); ++i) {
    const Candidate& cand = r.best[i];
    INFO(cand.layout.describe());
    CHECK(check_layout(m, c, setup, cand.layout).empty());
    CHECK(cand.fits);
    CHECK(cand.memory.terms.total() <= c.gpu.memory_gib * kGiB);
    CHECK(long(cand.layout.tp) * cand.layout.pp * cand.layout.dp == c.world());
    if (i) CHECK(r.best[i - 1].step_seconds() <= cand.step_seconds());
    // Re-evaluating a returned layout gives the same numbers as the search.
    const Candidate again = evaluate(m, c, setup, cand.layout);
    CHECK(again.step_seconds() == Approx(cand.step_seconds()).epsilon(1e-12));
    CHECK(again.memory.terms.total() == Approx(cand.memory.terms.total()).epsilon(1e-12));
  }
  for (const Candidate& cand : r.best_unfit) {
    CHECK(!cand.fits);
    CHECK(cand.memory.terms.total() > c.gpu.memory_gib * kGiB);
  }
}

TEST_CASE("fixed knobs restrict the search", "[planner]") {
  const ModelShape m = gpt3_shape_for_size(5);
  const Cluster c = cluster("A100-80GB", 2);
  TrainingSetup setup;
  setup.global_batch = 128;
  SearchSpace space;
  space.tp = {2};
  space.micro_batch = {2, 4};
  space.recompute = {RecomputeGranularity::kSelective, RecomputeGranularity::kFull};
  space.method = {RecomputeMethod::kBlock};
  space.distributed_optimizer = {1};
  const SearchResult r = search(m, c, setup, space, 1000);
  REQUIRE(!r.best.empty());
  for (const Candidate& cand : r.best) {
    CHECK(cand.layout.tp == 2);
    CHECK((cand.layout.micro_batch == 2 || cand.layout.micro_batch == 4));
    CHECK(cand.layout.recompute.granularity != RecomputeGranularity::kNone);
    if (cand.layout.recompute.granularity == RecomputeGranularity::kFull) CHECK(cand.layout.recompute.method == RecomputeMethod::kBlock);
    CHECK(cand.layout.distributed_optimizer);
  }
}

TEST_CASE("check_layout names the broken divisibility rule", "[planner]") {
  const ModelShape m = gpt3_shape_for_size(175);
  const Cluster c = cluster("A100-80GB", 4);
  TrainingSetup setup;
  setup.global_batch = 64;
  Layout L;
  L.tp = 8; L.pp = 4; L.dp = 1; L.micro_batch = 1;
  CHECK(check_layout(m, c, setup, L).empty());
  L.pp = 5;
  CHECK_THAT(check_layout(m, c, setup, L), Catch::Contains("must equal"));
  L.tp = 5; L.pp = 4; L.dp = 1;
  Cluster c20 = cluster("A100-80GB", 4);
  c20.gpus_per_node = 5;
  CHECK(check_layout(m, c20, setup, L) ==
        "model.num_attention_heads: expected a multiple of tensor_model_parallel_size (5), found 96");
  L.tp = 8; L.vp = 5;
  CHECK(check_layout(m, c, setup, L) == "model.num_layers: expected a multiple of pipeline_model_parallel_size*"
                                        "virtual_pipeline_model_parallel_size = 4*5 = 20, found 96");
  L.vp = 3;
  setup.global_batch = 30;  // 30 micro-batches, not a multiple of p = 4
  CHECK_THAT(check_layout(m, c, setup, L), Catch::Contains("the interleaved schedule expects num_microbatches"));
  setup.global_batch = 64;
  L.recompute.granularity = RecomputeGranularity::kFull;
  L.recompute.method = RecomputeMethod::kUniform;
  L.recompute.num_layers = 3;  // chunk of 96/(4·3) = 8 layers: groups of 3, 3, 2, as the model runs them
  CHECK(check_layout(m, c, setup, L).empty());
  L.recompute.num_layers = 9;
  CHECK(check_layout(m, c, setup, L) == "model.activations_checkpoint_num_layers: expected an integer in [1, 8] "
                                        "(layers per pipeline chunk) for method uniform, found 9");
  L.recompute.method = RecomputeMethod::kBlock;
  L.recompute.num_layers = 0;  // legal: nothing recomputed
  CHECK(check_layout(m, c, setup, L).empty());
}

TEST_CASE("a model that cannot fit reports the binding term", "[planner]") {
  const ModelShape m = gpt3_shape_for_size(175);
  const Cluster c = cluster("A100-40GB", 1);  // 8 GPUs: 175B needs ~3 TB of optimizer state
  TrainingSetup setup;
  setup.global_batch = 8;
  const SearchResult r = search(m, c, setup, SearchSpace{}, 5);
  CHECK(r.best.empty());
  CHECK(r.fitting == 0);
  REQUIRE(!r.best_unfit.empty());
  CHECK(r.unfit_by_term.count("weights+grads+optimizer") == 1);
  CHECK(std::string(r.best_unfit.front().memory.terms.largest_term()) == "weights+grads+optimizer");
}

TEST_CASE("175B on 1024 GPUs: search time and the shape of the winner", "[planner]") {
  const ModelShape m = gpt3_shape_for_size(175);
  const Cluster c = cluster("A100-80GB", 128);
  TrainingSetup setup;
  setup.global_batch = 1536;
  const SearchResult r = search(m, c, setup, SearchSpace{}, 50);
  std::cout << "175B on 1024 A100-80GB: " << r.enumerated << " layouts searched in " << r.seconds
            << " s, " << r.fitting << " fit\n";
  REQUIRE(!r.best.empty());
  const Layout& w = r.best.front().layout;
  // 175B weights + optimizer state need t·p >= 16 on 80 GB even fully sharded (6 B/param + 12/d).
  CHECK(w.tp * w.pp >= 16);
  CHECK(r.best.front().fits);
  CHECK(r.enumerated > 10000);
}
