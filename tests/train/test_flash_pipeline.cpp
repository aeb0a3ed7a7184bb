// The fused attention core (model.use_flash_attention; docs/design/sp_sar.md, "Fused attention")
// through the real training step on a p = 2 pipeline: each rank builds its stage, runs GptStep's
// 1F1B schedule over Gloo, and its loss and every gradient must equal the unfused whole model run
// in one process on the whole batch (hidden dropout on, keyed by global layer and sample;
// attention dropout 0, as the fused core requires), with and without full recompute.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <cmath>
#include <map>
#include <string>

#include "harness/multiprocess.h"
#include "harness/worker_groups.h"
#include "model/gpt_stage.h"
#include "train/gpt_step.h"
#include "train/model_setup.h"
#include "train/pipeline_reference.h"

using namespace loom;

namespace {
constexpr int kBatch = 4, kSeq = 8;

}  // namespace

LOOM_WORKER("flash_pipeline_step") {
  auto groups = test::worker_groups(1, 2);
  model::GptConfig cfg;
  cfg.num_layers = 4;
  cfg.hidden_size = 32;
  cfg.num_attention_heads = 4;
  cfg.vocab_size = 100;
  cfg.max_position_embeddings = 16;
  cfg.seq_length = kSeq;
  cfg.hidden_dropout = 0.1;
  cfg.attention_dropout = 0.0;
  cfg.seed = 7;
  model::GptConfig reference_cfg = cfg;  // unfused, no recompute
  cfg.use_flash_attention = true;
  if (test::env_int("FULL") == 1) {
    cfg.layout.recompute.granularity = model::RecomputeGranularity::kFull;
    cfg.layout.recompute.method = model::RecomputeMethod::kUniform;
    cfg.layout.recompute.num_layers = 1;
  }
  auto chunks = train::build_model_chunks(cfg, *groups, 1, at::kCPU);

  const test::ReferenceBatch batch = test::reference_batch(cfg.vocab_size, kBatch, kSeq);
  model::DropoutContext dropout;
  dropout.step = 3;
  dropout.global_batch = kBatch;
  Layout shape;  // m = global_batch / micro_batch = kBatch micro-batches; s is the model's (kSeq)
  shape.pp = 2;
  shape.vp = 1;
  shape.micro_batch = 1;
  shape.global_batch = kBatch;
  train::GptStep step(chunks, *groups, shape);
  const double loss = step.train(batch.micro_batches, dropout, at::Tensor(), {}).item<double>();

  test::check_against_whole_model(chunks, *groups, reference_cfg, batch, dropout, loss, /*tied_split=*/true, "");
  groups->world().barrier();
  groups->shutdown();
}

TEST_CASE("fused attention on a p=2 pipeline equals the unfused single-process run", "[train][multiprocess]") {
  for (const char* full : {"0", "1"}) {
    INFO("full recompute " << full);
    auto result = test::run_ranks("flash_pipeline_step", 2, {{"FULL", full}}, 180.0);
    INFO(result.summary());
    CHECK(result.exit_code() == 0);
  }
}
