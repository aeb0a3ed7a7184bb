// Runs that pass validation but cannot fit the machine are refused before any rank starts,
// with the numbers (planner/run_memory.h).
#include <catch2/catch.hpp>

#include "config/recipe.h"
#include "planner/run_memory.h"

using loom::config::load_recipe;
using loom::planner::estimate_run_memory;
using loom::planner::run_does_not_fit;

namespace {

const std::string kTiny = std::string(LOOM_SOURCE_DIR) + "/recipes/gpt3_tiny_cpu.yaml";
const std::string k175b = std::string(LOOM_SOURCE_DIR) + "/recipes/gpt3_175b.yaml";
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace

TEST_CASE("the tiny recipe fits a small machine", "[planner][run_memory]") {
  const auto recipe = load_recipe(kTiny);
  const auto e = estimate_run_memory(recipe);
  CHECK(e.local_ranks == 4);
  CHECK_FALSE(e.on_device);
  CHECK(e.model_state > 0);
  CHECK(e.host_per_rank() * 4 < 2 * kGiB);
  CHECK_FALSE(run_does_not_fit(recipe, 8 * kGiB, 4096).has_value());
  CHECK_FALSE(run_does_not_fit(recipe, std::nullopt, std::nullopt).has_value());
}

TEST_CASE("sizes beyond the host's memory are refused naming what needs it", "[planner][run_memory]") {
  const auto steps = run_does_not_fit(load_recipe(kTiny, {"trainer.max_steps=1000000000"}), 64 * kGiB, {});
  REQUIRE(steps.has_value());
  CHECK_THAT(*steps, Catch::Contains("the run does not fit this machine: 4 local ranks need at least") &&
                         Catch::Contains("data indices 357.6 GiB") && Catch::Contains("64.0 GiB are available") &&
                         Catch::Contains("trainer.max_steps"));
  const auto layers = run_does_not_fit(load_recipe(kTiny, {"model.num_layers=100000000"}), 64 * kGiB, {});
  REQUIRE(layers.has_value());
  CHECK_THAT(*layers, Catch::Contains("model state") && Catch::Contains("TiB (weights, gradients, optimizer)"));
  // Without a host figure (no /proc/meminfo) nothing is refused on host grounds.
  CHECK_FALSE(run_does_not_fit(load_recipe(kTiny, {"trainer.max_steps=1000000000"}), std::nullopt, {}).has_value());
}

TEST_CASE("more local ranks than the process limit are refused", "[planner][run_memory]") {
  const auto recipe = load_recipe(kTiny, {"trainer.devices=100000", "model.global_batch_size=100000",
                                          "model.micro_batch_size=1"});
  const auto why = run_does_not_fit(recipe, std::nullopt, 4096);
  REQUIRE(why.has_value());
  CHECK(*why == "trainer.devices = 100000 local ranks exceed this user's process limit (ulimit -u) of 4096");
  // Within the limit, their memory still counts: 100000 processes do not fit 64 GiB.
  const auto memory = run_does_not_fit(recipe, 64 * kGiB, std::nullopt);
  REQUIRE(memory.has_value());
  CHECK_THAT(*memory, Catch::Contains("100000 local ranks need at least"));
}

TEST_CASE("a model that cannot fit its GPUs is refused naming the GPU", "[planner][run_memory]") {
  // GPT-3 175B as shipped (t 4, p 8, 1024 GPUs) fits an A100-80GB; on one GPU it cannot.
  CHECK_FALSE(run_does_not_fit(load_recipe(k175b), 1024 * kGiB, std::nullopt).has_value());
  const auto one = load_recipe(k175b, {"trainer.num_nodes=1", "trainer.devices=1", "cluster.gpus_per_node=1",
                                       "model.tensor_model_parallel_size=1", "model.pipeline_model_parallel_size=1",
                                       "model.virtual_pipeline_model_parallel_size=null"});
  const auto e = estimate_run_memory(one);
  CHECK(e.on_device);
  CHECK(e.device_per_rank() > 2048 * kGiB);  // 175e9 parameters x 16 bytes of state at least
  const auto why = run_does_not_fit(one, 1024 * kGiB, std::nullopt);
  REQUIRE(why.has_value());
  CHECK_THAT(*why, Catch::Contains("the run does not fit its GPUs: each rank needs at least") &&
                       Catch::Contains("cluster.gpu A100-80GB has 80.0 GiB"));
}
