// Packed rows (docs/design/finetune.md, "Packed sequences") through the real training step at
// t = 2 with sequence parallelism and p = 2: GptStep hands every stage the micro-batch's
// position and segment ids, and the step's loss and every gradient equal the single-process
// model's on the same examples unpacked (each alone in its own padded row). Both means run over
// the same loss tokens, so they are equal although the rows differ. GPT and a Llama-shaped model,
// each attention core (unfused, core_attention under selective recomputation, SDPA, full
// recomputation). A control run without the segment ids must differ.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "harness/multiprocess.h"
#include "harness/worker_groups.h"
#include "model/gpt_stage.h"
#include "model/model_test_util.h"
#include "model/packed_examples.h"
#include "train/gpt_step.h"
#include "train/model_setup.h"

using namespace loom;
using model::test::PackedExamples;

namespace {

model::GptConfig config_from_env() {
  model::GptConfig c = test::env_int("LLAMA") == 1 ? model::test::tiny_llama_config() : model::test::tiny_config();
  c.num_layers = 4;  // two per stage
  return c;
}

void set_core(model::GptConfig& c, int core) {
  if (core == 1) c.layout.recompute.granularity = model::RecomputeGranularity::kSelective;
  if (core == 2) c.use_flash_attention = true;
  if (core == 3) {
    c.layout.recompute.granularity = model::RecomputeGranularity::kFull;
    c.layout.recompute.method = model::RecomputeMethod::kUniform;
    c.layout.recompute.num_layers = 1;
  }
}

/// Each packed row as one micro-batch (without segment ids for the control).
std::vector<train::MicroBatch> packed_micro_batches(const PackedExamples& p, bool with_segments) {
  std::vector<train::MicroBatch> out;
  for (int64_t r = 0; r < p.tokens.size(0); ++r) {
    train::MicroBatch mb;
    mb.tokens = p.tokens.slice(0, r, r + 1);
    mb.labels = p.labels.slice(0, r, r + 1);
    mb.loss_mask = p.loss_mask.slice(0, r, r + 1);
    mb.position_ids = p.positions.slice(0, r, r + 1);
    if (with_segments) mb.segment_ids = p.segments.slice(0, r, r + 1);
    mb.global_row = r;
    out.push_back(mb);
  }
  return out;
}

}  // namespace

LOOM_WORKER("packed_pipeline_step") {
  auto groups = test::worker_groups(2, 2);
  const model::GptConfig reference_cfg = config_from_env();  // unfused, one process
  model::GptConfig cfg = reference_cfg;
  cfg.layout.sequence_parallel = true;
  set_core(cfg, test::env_int("CORE"));
  const bool with_segments = test::env_int("CONTROL") != 1;
  auto chunks = train::build_model_chunks(cfg, *groups, 1, at::kCPU);

  const PackedExamples p =
      model::test::pack_examples(model::test::sample_packing(), cfg.seq_length, cfg.vocab_size);
  model::DropoutContext dropout;
  dropout.global_batch = p.tokens.size(0);
  Layout shape;  // one packed row per micro-batch
  shape.tp = 2;
  shape.pp = 2;
  shape.micro_batch = 1;
  shape.global_batch = p.tokens.size(0);
  train::GptStep step(chunks, *groups, shape);
  const double loss = step.train(packed_micro_batches(p, with_segments), dropout, at::Tensor(), {}).item<double>();

  // The reference: the examples unpacked, the whole model in one process, the mean over loss tokens.
  model::GptStage whole(reference_cfg, runtime::Communicator::solo());
  model::StageInputs in;
  in.tokens = p.tokens1;
  in.position_ids = p.positions1;
  in.labels = p.labels1;
  model::DropoutContext whole_dropout;  // dropout is off; the rows are the examples here
  whole_dropout.global_batch = p.tokens1.size(0);
  at::Tensor want_loss = (whole.forward(in, whole_dropout) * p.loss_mask1).sum() / p.loss_mask1.sum();
  want_loss.backward();
  const double loss_err = std::abs(loss - want_loss.item<double>()) / std::abs(want_loss.item<double>());
  std::map<std::string, at::Tensor> want;
  for (const auto& param : whole.parameters()) want[param.name] = param.tensor.grad();

  auto params = train::chunk_parameters(chunks);
  model::test::all_reduce_sequence_parallel_grads(params, groups->tensor());
  const std::string where = " on tp " + std::to_string(groups->coords().tp) + ", pp " + std::to_string(groups->coords().pp);
  std::vector<std::string> failures;
  double worst = 0.0;
  for (const auto& param : params) {
    at::Tensor g = model::test::full_grad(param, groups->tensor());
    if (param.word_embedding) groups->embedding().all_reduce(g);  // tied: the first and last stage's parts
    const std::string name = param.word_embedding ? "embedding.word_embeddings.weight" : param.name;
    LOOM_WCHECK(want.count(name), "(no reference gradient of " + name + ")");
    const double err = model::test::rel_err(g, want[name]);
    worst = std::max(worst, err);
    if (err >= 1e-5) failures.push_back(param.name + where + ": rel. error " + std::to_string(err));
  }
  LOOM_WCHECK(!params.empty());
  if (with_segments) {
    LOOM_WCHECK(loss_err < 1e-5, "(loss " + std::to_string(loss) + ", unpacked single process " +
                                     std::to_string(want_loss.item<double>()) + ")");
    std::string all;
    for (const auto& f : failures) all += "\n  " + f;
    LOOM_WCHECK(failures.empty(), "(gradients differ:" + all + ")");
  } else {  // the plain causal mask lets later examples see earlier ones: far beyond rounding
    LOOM_WCHECK(loss_err > 1e-4, "(control: loss rel. error " + std::to_string(loss_err) + ")");
    LOOM_WCHECK(worst > 1e-2, "(control: largest gradient rel. error " + std::to_string(worst) + where + ")");
  }
  groups->world().barrier();
  groups->shutdown();
}

TEST_CASE("packed rows at t=2 with SP and p=2 equal the unpacked examples in one process", "[train][multiprocess][packed]") {
  for (const char* llama : {"0", "1"}) {
    for (const char* core : {"0", "1", "2", "3"}) {
      INFO("llama " << llama << ", core " << core << " (0 unfused, 1 selective, 2 SDPA, 3 full recompute)");
      auto result = test::run_ranks("packed_pipeline_step", 4, {{"LLAMA", llama}, {"CORE", core}, {"CONTROL", "0"}}, 240.0);
      INFO(result.summary());
      CHECK(result.exit_code() == 0);
    }
  }
}

TEST_CASE("packed rows without segment ids at t=2 with SP and p=2 differ from the unpacked examples (control)",
          "[train][multiprocess][packed]") {
  auto result = test::run_ranks("packed_pipeline_step", 4, {{"LLAMA", "0"}, {"CORE", "0"}, {"CONTROL", "1"}}, 240.0);
  INFO(result.summary());
  CHECK(result.exit_code() == 0);
}
