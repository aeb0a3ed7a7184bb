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

using namespace loom;

namespace {
constexpr int kBatch = 4, kSeq = 8;

double rel_err(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-30);
}
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
    cfg.activations_checkpoint_granularity = model::RecomputeGranularity::kFull;
    cfg.activations_checkpoint_method = model::RecomputeMethod::kUniform;
    cfg.activations_checkpoint_num_layers = 1;
  }
  auto chunks = train::build_model_chunks(cfg, *groups, 1, at::kCPU);

  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  at::Tensor tokens = at::randint(cfg.vocab_size, {kBatch, kSeq}, gen, at::kLong);
  at::Tensor labels = at::randint(cfg.vocab_size, {kBatch, kSeq}, gen, at::kLong);
  at::Tensor mask = (at::rand({kBatch, kSeq}, gen) > 0.2).to(at::kFloat);
  at::Tensor positions = at::arange(kSeq, at::kLong).unsqueeze(0).expand({kBatch, kSeq}).contiguous();
  std::vector<train::MicroBatch> batches;
  for (int k = 0; k < kBatch; ++k)
    batches.push_back({tokens.slice(0, k, k + 1), labels.slice(0, k, k + 1), mask.slice(0, k, k + 1),
                       positions.slice(0, k, k + 1), k, {}});
  model::DropoutContext dropout;
  dropout.step = 3;
  dropout.global_batch = kBatch;
  train::RunShape shape;
  shape.p = 2;
  shape.v = 1;
  shape.m = kBatch;
  shape.micro_batch = 1;
  shape.global_batch = kBatch;
  shape.seq_length = kSeq;
  train::GptStep step(chunks, *groups, shape);
  const double loss = step.train(batches, dropout, 1.0, {}).item<double>();

  model::GptStage whole(reference_cfg, runtime::Communicator::solo());
  model::StageInputs in;
  in.tokens = tokens;
  in.position_ids = positions;
  in.labels = labels;
  at::Tensor want_loss = (whole.forward(in, dropout) * mask).sum() / mask.sum();
  want_loss.backward();
  std::map<std::string, at::Tensor> want;
  for (const auto& param : whole.parameters()) want[param.name] = param.tensor.grad();
  LOOM_WCHECK(std::abs(loss - want_loss.item<double>()) <= 1e-5 * std::abs(want_loss.item<double>()),
              "(loss " + std::to_string(loss) + ", unfused single process " + std::to_string(want_loss.item<double>()) + ")");
  int checked = 0;
  for (const auto& param : train::chunk_parameters(chunks)) {
    at::Tensor g = param.tensor.grad().detach().clone();
    const bool tied = param.word_embedding;  // p = 2: each end stage holds a part of the tied gradient
    if (tied) groups->embedding().all_reduce(g);
    const std::string name = tied ? "embedding.word_embeddings.weight" : param.name;
    LOOM_WCHECK(want.count(name), "(no reference gradient of " + name + ")");
    const double err = rel_err(g, want[name]);
    LOOM_WCHECK(err < 1e-5, "(" + param.name + ": rel. error " + std::to_string(err) + ")");
    ++checked;
  }
  LOOM_WCHECK(checked > 0);
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
