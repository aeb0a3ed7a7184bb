// Uneven pipeline stages (model.num_layers_in_first/last_pipeline_stage; docs/design/parallel_layout.md,
// "Uneven stages") through the real training step: each rank builds its chunks from the split
// (train::build_model_chunks), runs GptStep over the 1F1B or interleaved schedule on Gloo, and
// compares the step's loss and every gradient with the whole model run in one process on the
// whole batch (dropout on, keyed by global layer and sample, so the masks are the same).
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "harness/multiprocess.h"
#include "harness/worker_groups.h"
#include "model/gpt_stage.h"
#include "train/gpt_step.h"
#include "train/model_setup.h"
#include "train/pipeline_reference.h"

using namespace loom;

namespace {

constexpr int kBatch = 4, kSeq = 8;

std::optional<int> env_layers(const char* name) {
  const int n = test::env_int(name);
  return n > 0 ? std::optional<int>(n) : std::nullopt;
}

model::GptConfig config_from_env() {
  model::GptConfig c;
  c.num_layers = test::env_int("L");
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 100;
  c.max_position_embeddings = 16;
  c.seq_length = kSeq;
  c.hidden_dropout = c.attention_dropout = 0.1;
  c.seed = 7;
  c.layout.first_stage_layers = env_layers("FIRST");
  c.layout.last_stage_layers = env_layers("LAST");
  return c;
}


}  // namespace

LOOM_WORKER("uneven_pipeline_step") {
  const int p = test::env_int("P"), v = test::env_int("V");
  auto groups = test::worker_groups(1, p);
  const model::GptConfig cfg = config_from_env();
  const int pp = groups->coords().pp;

  // The stage holds exactly the layers the rules give it.
  auto chunks = train::build_model_chunks(cfg, *groups, v, at::kCPU);
  const std::string want_layers = test::env_str(("LAYERS" + std::to_string(pp)).c_str());
  std::string got_layers;
  for (const auto& c : chunks)
    got_layers += (got_layers.empty() ? "" : ",") + std::to_string(c.layout().first_layer) + "-" +
                  std::to_string(c.layout().last_layer);
  LOOM_WCHECK(got_layers == want_layers, "(stage " + std::to_string(pp) + " holds " + got_layers + ", expected " +
                                             want_layers + ")");

  // One global batch of 4 samples with some masked tokens, as 4 micro-batches of 1.
  const test::ReferenceBatch batch = test::reference_batch(cfg.vocab_size, kBatch, kSeq);
  model::DropoutContext dropout;
  dropout.step = 3;
  dropout.global_batch = kBatch;

  Layout shape;  // m = global_batch / micro_batch = kBatch micro-batches; s is the model's (kSeq)
  shape.pp = p;
  shape.vp = v;
  shape.micro_batch = 1;
  shape.global_batch = kBatch;
  train::GptStep step(chunks, *groups, shape);
  const double loss = step.train(batch.micro_batches, dropout, at::Tensor(), {}).item<double>();

  // The reference: the whole model, the whole batch, the mean over unmasked tokens.
  model::GptConfig whole_cfg = cfg;
  whole_cfg.layout.first_stage_layers.reset();
  whole_cfg.layout.last_stage_layers.reset();
  test::check_against_whole_model(chunks, *groups, whole_cfg, batch, dropout, loss, /*tied_split=*/p > 1,
                                  " on stage " + std::to_string(pp));
  groups->world().barrier();
  groups->shutdown();
}

TEST_CASE("uneven pipeline stages: loss and gradients equal the single-process run", "[train][multiprocess]") {
  struct Case {
    int p, v, layers, first, last;  // first/last 0: not set
    std::vector<std::string> stage_layers;  // per pipeline rank: its chunks' [first-last) layers
  };
  const Case cases[] = {
      {2, 1, 5, 2, 0, {"0-2", "2-5"}},                  // a light first stage (the embedding's)
      {2, 1, 5, 0, 1, {"0-4", "4-5"}},                  // a light last stage (the loss's)
      {4, 1, 6, 1, 1, {"0-1", "1-3", "3-5", "5-6"}},    // both ends lighter, 2 + 2 in the middle
      {4, 1, 7, 0, 1, {"0-2", "2-4", "4-6", "6-7"}},    // last only: 2 + 2 + 2 + 1
      {2, 2, 6, 2, 0, {"0-1,3-4", "1-3,4-6"}},          // interleaved: chunks of 1 and 2 layers
  };
  for (const auto& c : cases) {
    INFO("p=" << c.p << " v=" << c.v << " L=" << c.layers << " first=" << c.first << " last=" << c.last);
    std::map<std::string, std::string> env = {{"P", std::to_string(c.p)}, {"V", std::to_string(c.v)},
                                              {"L", std::to_string(c.layers)}, {"FIRST", std::to_string(c.first)},
                                              {"LAST", std::to_string(c.last)}};
    for (size_t r = 0; r < c.stage_layers.size(); ++r) env["LAYERS" + std::to_string(r)] = c.stage_layers[r];
    auto result = test::run_ranks("uneven_pipeline_step", c.p, env, 180.0);
    INFO(result.summary());
    CHECK(result.exit_code() == 0);
  }
}

TEST_CASE("pipeline_stage_layouts gives the rules' uneven ranges and refuses an illegal split", "[train]") {
  model::GptConfig cfg;
  cfg.num_layers = 18;
  cfg.layout.first_stage_layers = 2;
  cfg.layout.last_stage_layers = 4;
  const auto r0 = model::pipeline_stage_layouts(cfg, 4, 2, 0), r3 = model::pipeline_stage_layouts(cfg, 4, 2, 3);
  CHECK((r0[0].first_layer == 0 && r0[0].last_layer == 1 && r0[0].pre_process && !r0[0].post_process));
  CHECK((r0[1].first_layer == 9 && r0[1].last_layer == 10 && !r0[1].pre_process));
  CHECK((r3[0].first_layer == 7 && r3[0].last_layer == 9 && !r3[0].post_process));
  CHECK((r3[1].first_layer == 16 && r3[1].last_layer == 18 && r3[1].post_process));
  cfg.layout.last_stage_layers = 3;
  CHECK_THROWS_WITH(model::pipeline_stage_layouts(cfg, 4, 2, 0),
                    "pipeline_stage_layouts:\nmodel.num_layers_in_last_pipeline_stage: expected a multiple of "
                    "virtual_pipeline_model_parallel_size (2: the stage's model chunks are equal), found 3");
}
