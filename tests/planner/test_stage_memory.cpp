// Uneven pipeline stages in the planner (stage_splits.h, Layout::stage_layers) and its per-stage
// memory output (every_stage_memory, format_stage_memory): the splits the search tries, each
// stage's terms from its own layers and in-flight micro-batches, agreement with the worst-stage
// figure, and 44 layers on p = 8 planned and written as a recipe.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "planner/cli.h"
#include "planner/memory_breakdown.h"
#include "planner/report.h"
#include "planner/search.h"
#include "planner/stage_splits.h"

using namespace loom::planner;

namespace {
constexpr double kGiB = 1073741824.0;

ModelShape gpt(int layers, int hidden, int heads) {
  ModelShape m;
  m.num_layers = layers;
  m.hidden_size = hidden;
  m.num_attention_heads = heads;
  m.seq_length = 2048;
  m.vocab_size = 51200;
  return m;
}

Cluster a100(int nodes) {
  Cluster c;
  c.gpu = find_gpu("A100-80GB");
  c.num_nodes = nodes;
  c.gpus_per_node = 8;
  return c;
}
}  // namespace

TEST_CASE("the search's pipeline splits: even when legal, else lighter uneven end stages", "[planner]") {
  using S = std::vector<StageSplit>;
  CHECK(candidate_stage_splits(44, 8, 1) == S{{4, 4}});          // 4 + 6x6 + 4: 44 % 8 != 0
  CHECK(candidate_stage_splits(44, 8, 2) == S{{2, 0}, {4, 4}, {0, 2}});  // ends of 2..6 in chunks of 2
  CHECK(candidate_stage_splits(96, 8, 1) == S{{0, 0}});          // even only: lighter ends cannot add up
  CHECK(candidate_stage_splits(46, 8, 1) == S{{4, 0}, {5, 5}, {0, 4}});  // 4+6x7, 5+6x6+5, 6x7+4
  CHECK(candidate_stage_splits(8, 2, 1) == S{{0, 0}, {3, 0}, {5, 0}});   // 3+5 and 5+3 beside 4+4
  CHECK(candidate_stage_splits(12, 1, 1) == S{{0, 0}});
  CHECK(candidate_stage_splits(4, 8, 1).empty());                // more stages than layers
  for (const auto& s : candidate_stage_splits(46, 8, 1)) {
    Layout L;
    L.pp = 8;
    L.first_stage_layers = s.first_stage_layers();
    L.last_stage_layers = s.last_stage_layers();
    int sum = 0;
    for (int st = 0; st < 8; ++st) sum += L.stage_layers(46, st);
    CHECK(sum == 46);
  }
}

namespace {
// One layer's activations as Loom stores them at t = 2, b = 1, bf16, no SP, no recompute.
double loom_layer(const ModelShape& m) {
  return loom_layer_activation_bytes(m, 1, 2, false, RecomputeGranularity::kNone, false, Precision::kBf16);
}
}  // namespace

TEST_CASE("per-stage memory: each stage's own layers and in-flight micro-batches, the worst is the maximum",
          "[planner]") {
  const ModelShape m = gpt(44, 4096, 32);
  TrainingSetup setup;
  setup.global_batch = 64;
  Layout L;
  L.tp = 2; L.pp = 8; L.dp = 4; L.micro_batch = 1;  // m = 16 micro-batches
  L.first_stage_layers = 4; L.last_stage_layers = 4;
  const double cap = 80 * kGiB;
  const auto stages = every_stage_memory(m, setup, L, cap);
  REQUIRE(stages.size() == 8);
  const WorstStage worst = worst_stage_memory(m, setup, L, cap);
  double most = 0;
  int layers = 0;
  for (const StageMemory& st : stages) {
    INFO("stage " << st.stage);
    CHECK(st.layers == (st.stage == 0 || st.stage == 7 ? 4 : 6));
    CHECK(st.in_flight == std::min(16, 8 - st.stage));  // 1F1B: p - s in flight at stage s
    layers += st.layers;
    // The same numbers as the single-stage function, and activations = in flight x layers x per
    // layer as Loom stores them (plus the head on the last stage: its final LayerNorm input and
    // output, 2 sbh elements, and their statistics).
    CHECK(st.terms.total() == Approx(stage_memory(m, setup, L, st.stage, cap).total()));
    const double head = st.stage == 7 ? 2.0 * 2048 * 4096 * 2 + 8 * 2048 : 0.0;
    CHECK(st.terms.activations ==
          Approx(st.in_flight * st.layers * loom_layer(m) + head));
    most = std::max(most, st.terms.total());
  }
  CHECK(layers == 44);
  CHECK(worst.terms.total() == Approx(most));
  // The middle stages differ from the ends by their layers' parameters (plus embedding / logits).
  const double per_layer = layer_params_per_rank(m, 2) * bytes_per_param(Precision::kBf16, false, 4);
  const double vocab = 51200 / 2, h = 4096;
  CHECK(stages[1].terms.weights_optimizer - stages[0].terms.weights_optimizer ==
        Approx(2 * per_layer - (vocab * h + 2048 * h) * 18));
  CHECK(stages[6].terms.weights_optimizer - stages[7].terms.weights_optimizer ==
        Approx(2 * per_layer - (vocab * h + 2 * h) * 18));
  // Interleaved: stage s holds min(m·v, 2(p − s − 1) + (v − 1)p + 1) chunks of its own chunk size.
  L.vp = 2;
  const auto inter = every_stage_memory(m, setup, L, cap);
  CHECK(inter[0].in_flight == 2 * 7 + 8 + 1);
  CHECK(inter[0].terms.activations == Approx(23 * 2 * loom_layer(m)));
  CHECK(inter[7].in_flight == 9);
  // The report's table says the same numbers, the worst stage marked.
  PlanContext ctx;
  ctx.shape = m;
  ctx.cluster = a100(4);
  ctx.setup = setup;
  L.vp = 1;
  const std::string table = format_stage_memory(ctx, L);
  CHECK(table.find("memory per stage of t2 p8 f4 l4 v1 d4 b1 none") != std::string::npos);
  const auto mark = table.find("<- worst");
  REQUIRE(mark != std::string::npos);
  CHECK(table.find("<- worst", mark + 1) == std::string::npos);
  const auto line = table.rfind('\n', mark) + 1;
  CHECK(std::stoi(table.substr(line, 5)) == worst_stage_memory(m, setup, L, cap).stage);
}

TEST_CASE("44 layers on p = 8: the search plans an uneven split, and the written recipe says so", "[planner]") {
  const ModelShape m = gpt(44, 6144, 48);
  TrainingSetup setup;
  setup.global_batch = 512;
  SearchSpace space;
  space.pp = {8};
  space.tp = {8};
  space.vp = {1};
  const SearchResult r = search(m, a100(16), setup, space, 50);
  REQUIRE(!r.best.empty());
  for (const Candidate& c : r.best) {
    CHECK(c.layout.first_stage_layers == 4);
    CHECK(c.layout.last_stage_layers == 4);
  }
  space.uneven_stages = {0};
  CHECK(search(m, a100(16), setup, space, 50).enumerated == 0);  // an even split cannot cut 44 in 8

  const std::string yaml = "/tmp/loom_test_planner_" + std::to_string(getpid()) + "_uneven.yaml";
  std::vector<std::string> args = {"loom plan", "--num-layers", "44", "--hidden-size", "6144",
                                   "--num-attention-heads", "48", "--nodes", "16", "--global-batch-size", "512",
                                   "--tp", "8", "--pp", "8", "--vp", "1", "--write-recipe", yaml};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  REQUIRE(run_plan_command(int(argv.size()), argv.data()) == 0);
  std::ifstream in(yaml);
  std::stringstream text;
  text << in.rdbuf();
  const std::string recipe = text.str();
  CHECK(recipe.find("  num_layers_in_first_pipeline_stage: 4\n  num_layers_in_last_pipeline_stage: 4\n") !=
        std::string::npos);
  CHECK(recipe.find("# memory per stage of t8 p8 f4 l4") != std::string::npos);
  for (int stage = 0; stage < 8; ++stage)  // one comment line per stage, with its layer count
    CHECK(recipe.find("#     " + std::to_string(stage) + (stage == 0 || stage == 7 ? "      4" : "      6")) !=
          std::string::npos);
  std::remove(yaml.c_str());
}
