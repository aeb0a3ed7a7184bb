// Dotted command-line overrides: values parsed as YAML, unknown keys suggested, errors located
// at the override.
#include <catch2/catch.hpp>

#include "config/derived.h"
#include "config_test_util.h"

using namespace loom::config;
using loom::config::test::errors_of;
using loom::config::test::kMinimalRecipe;

TEST_CASE("overrides set scalars, sequences and new sections", "[config]") {
  const Recipe r = load_recipe_from_string(
      kMinimalRecipe, "min.yaml",
      {"model.num_layers=8", "model.optim.betas=[0.9,0.95]", "trainer.precision=bf16", "cluster.partition=batch",
       "model.data.data_prefix=[0.25, data/a, 0.75, data/b]", "exp_manager.explicit_log_dir=runs/x",
       "model.hidden_dropout=0", "model.sequence_parallel=True", "cluster.container_mounts=[/a:/a, /b:/b]",
       "model.optim.sched.name=WarmupAnnealing"});
  CHECK(r.model.num_layers == 8);
  CHECK(r.model.optim.betas == std::array<double, 2>{0.9, 0.95});
  CHECK(r.trainer.precision == Precision::kBf16);
  CHECK(r.cluster.partition == std::optional<std::string>("batch"));
  CHECK(r.model.data.data_prefix == std::vector<DataBlendEntry>{{0.25, "data/a"}, {0.75, "data/b"}});
  CHECK(run_directory(r) == "runs/x");
  CHECK(r.model.hidden_dropout == 0.0);
  CHECK(r.model.sequence_parallel);
  CHECK(r.cluster.container_mounts == std::vector<std::string>{"/a:/a", "/b:/b"});
  CHECK(r.model.optim.sched.name == SchedulerName::kLinearDecay);
  CHECK(r.origin.locations.at("model.num_layers").str() == "override 'model.num_layers=8'");
  CHECK(r.origin.locations.at("model.hidden_size").str() == "min.yaml:13:16");
}

TEST_CASE("later overrides win, empty value means null, aliases are accepted", "[config]") {
  const Recipe r = load_recipe_from_string(
      kMinimalRecipe, "min.yaml",
      {"model.seed=1", "model.seed=2", "model.virtual_pipeline_model_parallel_size=2", "model.num_layers=8",
       "model.virtual_pipeline_model_parallel_size=", "exp_manager.checkpoint_callback_params.every_n_train_steps=25"});
  CHECK(r.model.seed == 2);
  CHECK_FALSE(r.model.virtual_pipeline_model_parallel_size.has_value());
  CHECK(r.exp_manager.checkpoint_callback_params.every_n_steps == 25);
}

TEST_CASE("overrides flow through interpolations", "[config]") {
  const Recipe r = load_recipe(test::recipe_file("gpt3_tiny_cpu.yaml"),
                               {"model.encoder_seq_length=256", "model.hidden_size=64", "run.name=other"});
  CHECK(r.model.max_position_embeddings == 256);  // ${.encoder_seq_length}
  CHECK(r.model.data.seq_length == 256);          // ${model.encoder_seq_length}
  CHECK(r.model.ffn_hidden_size == 256);          // ${multiply:4, ${.hidden_size}}
  CHECK(r.run.results_dir == std::optional<std::string>("runs/other"));
  CHECK(run_directory(r) == "runs/other");
}

TEST_CASE("bad overrides name the override", "[config]") {
  CHECK(errors_of(kMinimalRecipe, {"model.hiden_size=64"}) ==
        std::vector<std::string>{"override 'model.hiden_size=64': model.hiden_size: unknown key: expected a key of "
                                 "section 'model', found 'hiden_size' (did you mean 'model.hidden_size'?)"});
  CHECK(errors_of(kMinimalRecipe, {"trainer.global_batch_size=64"}) ==
        std::vector<std::string>{"override 'trainer.global_batch_size=64': trainer.global_batch_size: unknown key: "
                                 "expected a key of section 'trainer', found 'global_batch_size' (did you mean "
                                 "'model.global_batch_size'?)"});
  CHECK(errors_of(kMinimalRecipe, {"modle.num_layers=2"}) ==
        std::vector<std::string>{"override 'modle.num_layers=2': modle.num_layers: unknown key: expected a top-level "
                                 "section, found 'modle' (did you mean 'model.num_layers'?)"});
  CHECK(errors_of(kMinimalRecipe, {"model.num_layers"}) ==
        std::vector<std::string>{"override 'model.num_layers': expected section.key=value, found no '=' or an empty key"});
  CHECK(errors_of(kMinimalRecipe, {"model.num_layers=two"}) ==
        std::vector<std::string>{"override 'model.num_layers=two': model.num_layers: expected an integer, found two"});
  CHECK(errors_of(kMinimalRecipe, {"model.optim.betas=[0.9, 0.95"}) ==
        std::vector<std::string>{"override 'model.optim.betas=[0.9, 0.95': model.optim.betas: cannot parse the value as "
                                 "YAML (override 'model.optim.betas=[0.9, 0.95':1:1: YAML syntax error: end of sequence "
                                 "flow not found)"});
  // A value that is well-typed but breaks a cross-field rule is located at the override.
  CHECK(errors_of(kMinimalRecipe, {"trainer.devices=3"}) ==
        std::vector<std::string>{"override 'trainer.devices=3': trainer.devices: expected the world size "
                                 "num_nodes*devices = 1*3 = 3 to be a multiple of tensor_model_parallel_size*"
                                 "pipeline_model_parallel_size = 2*2 = 4, found remainder 3"});
}

TEST_CASE("all bad overrides are reported together", "[config]") {
  const auto errors = errors_of(kMinimalRecipe, {"model.foo=1", "model.num_layers=x", "trainer.max_steps=0"});
  REQUIRE(errors.size() == 3);
  CHECK(errors[0].rfind("override 'model.foo=1': model.foo: unknown key", 0) == 0);
  CHECK(errors[1] == "override 'model.num_layers=x': model.num_layers: expected an integer, found x");
  CHECK(errors[2] == "override 'trainer.max_steps=0': trainer.max_steps: expected an integer >= 1, found 0");
}

TEST_CASE("a field's value is not a section: the error says so instead of suggesting the key given", "[config]") {
  CHECK(errors_of(kMinimalRecipe, {"model.num_layers.x=2"}) ==
        std::vector<std::string>{"override 'model.num_layers.x=2': model.num_layers.x: 'model.num_layers' is a value, "
                                 "not a section, so it has no key 'x' (the items of a list are addressed by index from "
                                 "0, as in 'model.num_layers.0=VALUE')"});
}
