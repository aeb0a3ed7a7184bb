// Bytes saved for backward per transformer layer, measured by the saved-tensor recorder,
// against Korthikanti et al.'s formulas (docs/design/sp_sar.md) minus the dropout masks Loom regenerates
// instead of storing: in paper units (2 B per activation element), per layer,
//   no parallelism sbh(32 + 4as/h), TP sbh(8 + 24/t + 4as/(ht)), TP+SP sbh(32/t + 4as/(ht)),
//   TP+selective sbh(8 + 24/t), TP+SP+selective sbh·32/t, full recompute 2sbh (2sbh/t with SP).
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <chrono>

#include "harness/multiprocess.h"
#include "harness/worker_groups.h"
#include "launch/env_rendezvous.h"
#include "model/activation_memory.h"
#include "model/gpt_stage.h"
#include "runtime/process_groups.h"

using namespace loom;
using namespace loom::model;

namespace {

constexpr int64_t kS = 64, kB = 2, kH = 64, kA = 4;  // 5as/h = 20

// Mean paper bytes per layer over a 2-layer model's forward, in units of sbh.
double per_layer_sbh(const runtime::CommunicatorPtr& tp, bool sp, RecomputeGranularity g) {
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = kH;
  c.num_attention_heads = kA;
  c.vocab_size = 128;
  c.seq_length = c.max_position_embeddings = kS;
  c.hidden_dropout = c.attention_dropout = 0.1;
  c.layout.sequence_parallel = sp;
  c.layout.recompute.granularity = g;
  GptStage model(c, tp);
  StageInputs in;
  in.tokens = at::arange(kB * kS, at::kLong).remainder(128).view({kB, kS});
  in.labels = in.tokens.roll(1, 1);
  in.position_ids = at::arange(kS, at::kLong).unsqueeze(0).expand({kB, kS}).contiguous();
  ActivationMemoryRecorder recorder(model.parameters());
  at::Tensor loss = model.forward(in, DropoutContext{});
  auto scopes = recorder.per_scope();
  const double bytes = (scopes[0].paper_bytes + scopes[1].paper_bytes) / 2.0;
  return bytes / static_cast<double>(kS * kB * kH);
}

// LayerNorm statistics (mean, rstd: fp32 per token, two LayerNorms) are not in the formulas:
// 4 values per token = 8 paper bytes per token = 8/h sbh (divided by t under SP).
double with_ln_stats(double formula, double t_sp) { return formula + 8.0 / kH / t_sp; }

}  // namespace

TEST_CASE("single process: measured activation bytes per layer match the formulas", "[model]") {
  auto solo = runtime::Communicator::solo();
  const double r = 4.0 * kA * kS / kH;  // 4as/h: softmax output + dropout output
  CHECK(per_layer_sbh(solo, false, RecomputeGranularity::kNone) ==
        Approx(with_ln_stats(32 + r, 1)).epsilon(1e-6));
  CHECK(per_layer_sbh(solo, false, RecomputeGranularity::kSelective) ==
        Approx(with_ln_stats(32, 1)).epsilon(1e-6));
  CHECK(per_layer_sbh(solo, false, RecomputeGranularity::kFull) == Approx(2.0).epsilon(1e-6));
}

LOOM_WORKER("activation_memory_t2") {
  auto groups = loom::test::worker_groups(2);
  auto tp = groups->tensor_ptr();
  const double t = 2, r = 4.0 * kA * kS / kH;
  struct Case {
    const char* name;
    bool sp;
    RecomputeGranularity g;
    double expected;
  } cases[] = {
      {"TP", false, RecomputeGranularity::kNone, with_ln_stats(8 + 24 / t + r / t, 1)},
      {"TP+SP", true, RecomputeGranularity::kNone, with_ln_stats(32 / t + r / t, t)},
      {"TP+selective", false, RecomputeGranularity::kSelective, with_ln_stats(8 + 24 / t, 1)},
      {"TP+SP+selective", true, RecomputeGranularity::kSelective, with_ln_stats(32 / t, t)},
      {"TP+SP+full", true, RecomputeGranularity::kFull, 2 / t},
  };
  for (const auto& c : cases) {
    const double got = per_layer_sbh(tp, c.sp, c.g);
    LOOM_WCHECK(std::abs(got - c.expected) <= 1e-6 * c.expected,
                + std::string(c.name) + ": measured " + std::to_string(got) + " sbh, expected " +
                    std::to_string(c.expected));
  }
  groups->shutdown();
}

TEST_CASE("t=2: measured activation bytes per layer match the formulas for TP, SP, selective",
          "[model][multiprocess]") {
  auto r = loom::test::run_ranks("activation_memory_t2", 2, {}, 120.0);
  INFO(r.summary());
  CHECK(r.exit_code() == 0);
}

TEST_CASE("the recorder counts a storage once and skips parameters", "[model]") {
  at::Tensor w = at::randn({4, 4}).requires_grad_(true);
  at::Tensor x = at::randn({3, 4});
  Param p{"w", w, -1};
  ActivationMemoryRecorder recorder({p});
  {
    ActivationScope scope(7);
    at::Tensor y = at::mm(x, w);                  // saves x (48 B) for dW
    at::Tensor z = at::mm(x.narrow(0, 0, 2), w);  // a view of x: same storage, not counted again
    at::Tensor u = y.sigmoid();                   // saves its result u (48 B)
    at::Tensor v = at::mm(x, w.t());              // saves x again and w (a parameter: skipped)
    (void)z, (void)u, (void)v;
  }
  auto scopes = recorder.per_scope();
  REQUIRE(scopes.count(7) == 1);
  CHECK(scopes[7].storages == 2);               // x, and the sigmoid result
  CHECK(scopes[7].bytes == 48 + 48);
  CHECK(scopes[7].paper_bytes == 24 + 24);
}
