// GPT-3 shapes from a size (docs/design/planner_sources.md's layer rule) and the parameter / FLOP formulas of
// docs/design/sp_sar.md.
#include <catch2/catch.hpp>

#include <stdexcept>

#include "planner/model_shape.h"

using namespace loom::planner;

TEST_CASE("gpt3_shape_for_size reproduces the NeMo shapes", "[planner]") {
  struct Row { double size; int layers, hidden, heads; };
  const Row rows[] = {{0.126, 12, 768, 12}, {5, 24, 4096, 32}, {20, 44, 6144, 48}, {175, 96, 12288, 96},
                      {40, 48, 8192, 64}};
  for (const auto& r : rows) {
    ModelShape m = gpt3_shape_for_size(r.size);
    INFO("size " << r.size);
    CHECK(m.num_layers == r.layers);
    CHECK(m.hidden_size == r.hidden);
    CHECK(m.num_attention_heads == r.heads);
    CHECK(m.ffn() == 4 * r.hidden);
  }
  CHECK_THROWS_AS(gpt3_shape_for_size(0), std::invalid_argument);
  CHECK_THROWS_AS(gpt3_shape_for_size(2000), std::invalid_argument);
}

TEST_CASE("parameter count matches the GPT-3 size formula plus the final LayerNorm", "[planner]") {
  ModelShape m = gpt3_shape_for_size(175);
  const double L = 96, h = 12288, V = 51200, s = 2048;
  const double expected = 12 * L * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * L * h)) + 2 * h;
  CHECK(m.parameter_count() == Approx(expected).epsilon(1e-12));
  CHECK(gpt3_size_formula(96, 12288, 2048, 51200) == Approx(expected - 2 * h).epsilon(1e-12));
  CHECK(m.parameter_count() / 1e9 == Approx(174.6).margin(0.05));
}

TEST_CASE("FLOP formulas match Korthikanti and Narayanan closed forms", "[planner]") {
  ModelShape m;
  m.num_layers = 96; m.hidden_size = 12288; m.num_attention_heads = 96;
  const double L = 96, h = 12288, s = 2048, V = 51200;
  CHECK(m.model_flops_per_sample() ==
        Approx(72 * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L))).epsilon(1e-12));
  CHECK(m.full_recompute_flops_per_sample() ==
        Approx(96 * L * s * h * h * (1 + s / (6 * h) + V / (16 * h * L))).epsilon(1e-12));
}

TEST_CASE("model shape validation names the field", "[planner]") {
  ModelShape m;
  m.num_layers = 4; m.hidden_size = 100; m.num_attention_heads = 3;
  try {
    m.validate();
    FAIL("expected an error");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("num_attention_heads") != std::string::npos);
  }
  m.num_attention_heads = 4;
  m.vocab_size = 0;
  CHECK_THROWS_WITH(m.validate(), Catch::Contains("vocab_size"));
}
