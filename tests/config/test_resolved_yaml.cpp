// to_yaml(): every schema field, defaults filled, canonical spellings, round trip.
#include <catch2/catch.hpp>

#include "config/schema.h"
#include "config_test_util.h"

using namespace loom::config;
using loom::config::test::kMinimalRecipe;

TEST_CASE("resolved YAML lists every field with defaults filled", "[config]") {
  const Recipe r = load_recipe_from_string(kMinimalRecipe, "min.yaml", {"trainer.precision=bf16-mixed"});
  const std::string yaml = to_yaml(r);
  CHECK(yaml.rfind("# Loom recipe, fully resolved (defaults and derived values filled in)\n# source: min.yaml\n"
                   "# override: trainer.precision=bf16-mixed\nrun:\n  name: megatron_gpt\n",
                   0) == 0);
  for (const char* line : {"  precision: bf16\n", "  ffn_hidden_size: 512\n", "  max_position_embeddings: 128\n",
                           "  layernorm_epsilon: 1.0e-05\n", "    eps: 1.0e-08\n", "    betas: [0.9, 0.98]\n",
                           "    data_prefix: [1.0, data/x_text_document]\n", "    splits_string: \"900,50,50\"\n",
                           "  virtual_pipeline_model_parallel_size: null\n",
                           "  activations_checkpoint_granularity: null\n", "      max_steps: 10\n",
                           "    every_n_steps: 100\n", "  container_mounts: []\n", "  gpus_per_node: 4\n"}) {
    INFO(line);
    CHECK(yaml.find(line) != std::string::npos);
  }
  // Every field of the schema appears as a key.
  for (const auto& path : detail::key_index().fields) {
    const std::string leaf = path.substr(path.rfind('.') + 1);
    INFO(path);
    CHECK(yaml.find(" " + leaf + ":") != std::string::npos);
  }
}

TEST_CASE("resolved YAML loads back to the same recipe", "[config]") {
  const Recipe a = load_recipe_from_string(
      kMinimalRecipe, "min.yaml",
      {"run.name=true", "run.results_dir=\"a: b # c\"", "model.optim.lr=6e-4", "model.init_method_std=0.008165",
       "cluster.container_image=nvcr.io/nvidia/nemo:24.05", "trainer.max_time=\"00:23:30:00\""});
  const Recipe b = load_recipe_from_string(to_yaml(a), "resolved.yaml");
  CHECK(b.run.name == "true");  // quoted on output so it stays a string
  CHECK(b.run.results_dir == std::optional<std::string>("a: b # c"));
  CHECK(b.model.optim.lr == 6e-4);
  CHECK(b.model.init_method_std == 0.008165);
  CHECK(b.cluster.container_image == std::optional<std::string>("nvcr.io/nvidia/nemo:24.05"));
  CHECK(b.trainer.max_time == std::optional<std::string>("00:23:30:00"));
  CHECK(to_yaml(b).substr(to_yaml(b).find("run:")) == to_yaml(a).substr(to_yaml(a).find("run:")));
}
