// Derived values: vocab padding (Megatron's rule), batch arithmetic, run directory, edit distance.
#include <catch2/catch.hpp>

#include "config/derived.h"
#include "config/suggest.h"
#include "config_test_util.h"

using namespace loom::config;
using loom::config::test::kMinimalRecipe;

TEST_CASE("padded_vocab_size pads to lcm(divisible_by, t), the model's rule", "[config]") {
  // Equal shards on every TP rank; unlike Megatron's divisible_by·t the size does not grow
  // with power-of-two t.
  for (int64_t t : {1, 2, 4, 8, 16, 128}) CHECK(padded_vocab_size(50257, 128, t) == 50304);
  CHECK(padded_vocab_size(50257, 128, 3) == 50304);  // lcm 384; 50304 = 131·384
  CHECK(padded_vocab_size(50257, 128, 5) == 50560);  // lcm 640
  CHECK(padded_vocab_size(50257, 128, 256) == 50432);
  CHECK(padded_vocab_size(50304, 128, 1) == 50304);  // already a multiple
  CHECK(padded_vocab_size(1, 1, 1) == 1);
  CHECK_THROWS_AS(padded_vocab_size(0, 128, 1), std::invalid_argument);
  CHECK_THROWS_AS(padded_vocab_size(50257, 128, 0), std::invalid_argument);
}

TEST_CASE("batch arithmetic", "[config]") {
  const Recipe r = load_recipe_from_string(kMinimalRecipe, "min.yaml",
                                           {"trainer.num_nodes=2", "trainer.devices=8", "model.global_batch_size=64"});
  CHECK(world_size(r) == 16);
  CHECK(data_parallel_size(r) == 4);       // 16 / (2*2)
  CHECK(num_microbatches(r) == 8);         // 64 / (2*4)
  CHECK(virtual_pipeline_size(r) == 1);
  CHECK(layers_per_chunk(r) == 2);
}

TEST_CASE("run directory", "[config]") {
  Recipe r = load_recipe_from_string(kMinimalRecipe, "min.yaml");
  CHECK(run_directory(r) == "runs/megatron_gpt");
  r = load_recipe_from_string(kMinimalRecipe, "min.yaml", {"exp_manager.exp_dir=/tmp/exp", "exp_manager.name=a"});
  CHECK(run_directory(r) == "/tmp/exp/a");
  r = load_recipe_from_string(kMinimalRecipe, "min.yaml", {"exp_manager.explicit_log_dir=/tmp/run1"});
  CHECK(run_directory(r) == "/tmp/run1");
}

TEST_CASE("edit distance and closest key", "[config]") {
  using loom::config::detail::closest;
  using loom::config::detail::edit_distance;
  CHECK(edit_distance("kitten", "sitting") == 3);
  CHECK(edit_distance("", "abc") == 3);
  CHECK(edit_distance("Hidden_Size", "hidden_size") == 0);
  CHECK(edit_distance("hiden_size", "hidden_size") == 1);
  CHECK(closest("num_layer", {"num_layers", "num_attention_heads", "seed"}) == "num_layers");
  CHECK(closest("x", {}).empty());
}

TEST_CASE("parse_max_time reads DD:HH:MM:SS with any number of day digits", "[config]") {
  CHECK(parse_max_time("00:23:30:00") == 23 * 3600 + 30 * 60);
  CHECK(parse_max_time("125:00:00:01") == 125LL * 86400 + 1);
  CHECK(parse_max_time("00:00:00:03") == 3);
  CHECK_FALSE(parse_max_time("23:30:00"));
  CHECK_FALSE(parse_max_time("00:23:3a:00"));
  CHECK_FALSE(parse_max_time("00-23:30:00"));
  CHECK_FALSE(parse_max_time("9999999999999:00:00:00"));
}
