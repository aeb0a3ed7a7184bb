// The planner's breakdown of what Loom allocates per stage (planner/memory_breakdown.h) against
// hand-derived figures of the code it follows; `loom plan --validate-memory`
// (tests/python/test_plan_memory.py) checks the same figures against the stand-in device.
#include <catch2/catch.hpp>

#include "planner/memory_breakdown.h"
#include "planner/memory_model.h"

using namespace loom::planner;

namespace {
ModelShape tiny() {
  ModelShape m;
  m.num_layers = 4;
  m.hidden_size = 128;
  m.num_attention_heads = 4;
  m.seq_length = m.max_position_embeddings = 128;  // a position table of s rows, as its recipe
  m.vocab_size = 50304;
  return m;
}
Layout layout(int t, int p, int d, int b, int micro_batches) {
  Layout L;
  L.tp = t;
  L.pp = p;
  L.dp = d;
  L.micro_batch = b;
  L.global_batch = int64_t(b) * micro_batches * d;
  return L;
}
TrainingSetup setup_for(const Layout& L, Precision precision, OptimizerUpdate update = OptimizerUpdate::kFused) {
  TrainingSetup s;
  s.global_batch = int(L.global_batch);
  s.precision = precision;
  s.optimizer_update = update;
  return s;
}
}  // namespace

TEST_CASE("model states: Loom's bytes per parameter", "[planner][memory]") {
  const ModelStates bf16 = model_states(1, Precision::kBf16, false, 1);
  CHECK(bf16.parameters == 2);
  CHECK(bf16.gradients == 4);
  CHECK(bf16.main_params == 4);
  CHECK(bf16.optimizer_moments == 8);
  // fp16 keeps its gradients in the same fp32 buffer: 18 B, not Megatron's 20.
  CHECK(model_states(1, Precision::kFp16, false, 1).total() == 18);
  CHECK(model_states(1, Precision::kBf16, true, 4).total() == Approx(6 + 12.0 / 4));
  // fp32: the parameters are their own main copy, but a distributed shard is a copy.
  CHECK(model_states(1, Precision::kFp32, false, 1).total() == 16);
  CHECK(model_states(1, Precision::kFp32, true, 4).total() == Approx(8 + 12.0 / 4));
  CHECK(bytes_per_param(Precision::kFp16, true, 2) == Approx(6 + 12.0 / 2));
}

TEST_CASE("Loom's stored activations per layer: the paper's table without dropout masks", "[planner][memory]") {
  const ModelShape m = tiny();
  const double s = 128, b = 2, h = 128, a = 4, sbh = s * b * h;
  // bf16, no parallelism: sbh(32 + 4as/h) bytes (docs/design/sp_sar.md, "What Loom itself
  // stores") plus two LayerNorms' fp32 mean and rstd per token.
  CHECK(loom_layer_activation_bytes(m, 2, 1, false, RecomputeGranularity::kNone, false, Precision::kBf16) ==
        Approx(sbh * (32 + 4 * a * s / h) + 16 * s * b));
  // TP + SP + selective: sbh·32/t, statistics t-fold fewer.
  CHECK(loom_layer_activation_bytes(m, 2, 2, true, RecomputeGranularity::kSelective, false, Precision::kBf16) ==
        Approx(sbh * 32 / 2 + 8 * s * b));
  // TP without SP: the 8 sbh of LayerNorm and GEMM inputs stay whole.
  CHECK(loom_layer_activation_bytes(m, 2, 2, false, RecomputeGranularity::kSelective, false, Precision::kBf16) ==
        Approx(sbh * (8 + 24.0 / 2) + 16 * s * b));
  // Full recompute keeps the input; fp32 doubles the elements, not the statistics.
  CHECK(loom_layer_activation_bytes(m, 2, 2, true, RecomputeGranularity::kFull, false, Precision::kFp32) ==
        Approx(4 * sbh / 2));
  CHECK(loom_layer_activation_bytes(m, 2, 1, false, RecomputeGranularity::kNone, false, Precision::kFp32) ==
        Approx(2 * sbh * (32 + 4 * a * s / h) + 16 * s * b));
}

TEST_CASE("one rank: after the step the model states, at the peak the logits", "[planner][memory]") {
  const ModelShape m = tiny();
  const Layout L = layout(1, 1, 1, 2, 2);
  const StageBreakdown b = stage_breakdown(m, setup_for(L, Precision::kFp32), L, 0);
  const double P = m.parameter_count();
  CHECK(b.states.total() == Approx(16 * P));
  CHECK(b.after_step() == Approx(16 * P));
  CHECK(b.layers == 4);
  CHECK(b.in_flight == 1);
  // The fp32 logits and the shifted copy that becomes the saved softmax: 8·s·b·V bytes in the
  // cross entropy's forward.
  CHECK(b.moment == PeakMoment::kForward);
  CHECK(b.at_peak.logits == Approx(8.0 * 128 * 2 * 50304));
  CHECK(b.peak() > b.after_step());
}

TEST_CASE("1F1B: stage 0 holds p micro-batches, the last one", "[planner][memory]") {
  const ModelShape m = tiny();
  // Micro-batches of 16 samples: the held activations outweigh the optimizer moment.
  const Layout L = layout(1, 2, 1, 16, 4);
  const auto stages = every_stage_breakdown(m, setup_for(L, Precision::kBf16), L);
  REQUIRE(stages.size() == 2);
  CHECK(stages[0].in_flight == 2);
  CHECK(stages[1].in_flight == 1);
  const double layer = loom_layer_activation_bytes(m, 16, 1, false, RecomputeGranularity::kNone, false, Precision::kBf16);
  REQUIRE(stages[0].moment == PeakMoment::kBackward);
  CHECK(stages[0].at_peak.activations == Approx(2 * 2 * layer));
  // The last stage holds the tied output embedding copy and the final LayerNorm.
  CHECK(stages[1].states.parameters - stages[0].states.parameters == Approx(2.0 * (2 * 128 - 128 * 128)));
}

TEST_CASE("optimizer moment: the update's temporaries and the distributed optimizer's gathers", "[planner][memory]") {
  const ModelShape m = tiny();
  Layout L = layout(1, 1, 2, 1, 1);
  // Per-tensor AdamW: 8 B per element of the largest tensor (the word embedding), after the
  // logits are gone.
  const StageBreakdown per_tensor = stage_breakdown(m, setup_for(L, Precision::kFp32, OptimizerUpdate::kPerTensor), L, 0);
  const StageBreakdown fused = stage_breakdown(m, setup_for(L, Precision::kFp32), L, 0);
  CHECK(per_tensor.peak() >= fused.peak());
  L.distributed_optimizer = true;
  // bf16 distributed: every bucket's bf16 shard and gathered copy at once, 2·P·(1 + 1/d).
  const StageBreakdown dist = stage_breakdown(m, setup_for(L, Precision::kBf16), L, 0);
  const double P = m.parameter_count();
  CHECK(dist.states.total() == Approx((6 + 12.0 / 2) * P));
  // The gathers' 2·P·(1 + 1/d) bytes, seen where they outlive the step (overlapped gather).
  TrainingSetup overlap = setup_for(L, Precision::kBf16);
  overlap.overlap_param_gather = true;
  CHECK(stage_breakdown(m, overlap, L, 0).after_step() == Approx(dist.after_step() + 2 * P * 1.5));
}
