// One training-FLOPs count and one table of device peaks (issue 28): the model FLOPs the step log
// divides by the step time for MFU are the planner's, also for an FFN that is not 4h, and the
// step log's peak comes from the planner's GPU table.
#include <catch2/catch.hpp>

#include <string>

#include "config/derived.h"
#include "config/recipe.h"
#include "planner/hardware.h"
#include "planner/recipe_input.h"
#include "planner/search.h"
#include "train/model_setup.h"

using namespace loom;

TEST_CASE("the step log's model FLOPs equal the planner's for a model with ffn != 4h", "[train][flops]") {
  // The tiny CPU recipe (h = 128, t = 2, p = 2 on 4 ranks) with an MLP of 3h instead of 4h.
  const config::Recipe r =
      config::load_recipe(std::string(LOOM_SOURCE_DIR) + "/recipes/gpt3_tiny_cpu.yaml", {"model.ffn_hidden_size=384"});
  // The tokenizer's vocabulary as the planner reads it (GPT-2's 50257 when the files are elsewhere).
  const model::GptConfig cfg = train::gpt_config_from_recipe(r, planner::recipe_vocab_size(r));
  const Layout layout = config::recipe_layout(r);
  REQUIRE(cfg.ffn() == 384);
  REQUIRE(cfg.ffn() != 4 * cfg.hidden_size);
  const double trainer = train::model_flops_per_step(cfg, layout);

  const planner::RecipePlanInput in = planner::plan_input_from_recipe(r);
  REQUIRE(in.shape.ffn() == 384);
  CHECK(trainer == in.shape.model_flops_per_sample() * in.setup.global_batch);

  // The planner's model TFLOP/s per GPU times the step and the GPUs gives the same count back.
  planner::Cluster cluster;
  cluster.gpu = planner::find_gpu("A100-80GB");
  cluster.num_nodes = 1;
  cluster.gpus_per_node = 4;
  const planner::Candidate cand = planner::evaluate(in.shape, cluster, in.setup, in.layout);
  const planner::Throughput t = planner::throughput(in.shape, cluster, in.setup, cand, 0, 0);
  CHECK(t.model_tflops_per_gpu * 1e12 * cand.step_seconds() * cluster.world() == Approx(trainer).epsilon(1e-12));

  // Not the closed form that assumes ffn = 4h (what the step log counted before): with 3h the
  // MLP's 16·s·h² per layer becomes 12·s·h².
  const double B = double(layout.global_batch), L = double(cfg.num_layers), s = double(cfg.seq_length),
               h = double(cfg.hidden_size), V = double(cfg.padded_vocab_size(layout.tp));
  const double four_h = 72 * B * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L));
  CHECK(trainer == Approx(four_h - 3 * B * L * s * 4 * h * (4 * h - 3 * h)).epsilon(1e-12));
  CHECK(trainer < four_h);
}

TEST_CASE("the step log's MFU peak is the planner's GPU table", "[train][flops]") {
  CHECK(planner::peak_tflops_for_device("NVIDIA H200") == planner::find_gpu("H200").peak_tflops);
  CHECK(planner::peak_tflops_for_device("NVIDIA H100 80GB HBM3") == planner::find_gpu("H100").peak_tflops);
  CHECK(planner::peak_tflops_for_device("NVIDIA A100-SXM4-80GB") == planner::find_gpu("A100-80GB").peak_tflops);
  CHECK(planner::peak_tflops_for_device("NVIDIA H200") == 989.0);
  CHECK(planner::peak_tflops_for_device("NVIDIA A100-PCIE-40GB") == 312.0);
  CHECK_FALSE(planner::peak_tflops_for_device("cpu"));
  CHECK_FALSE(planner::peak_tflops_for_device("standin"));
}
