// Memory model against docs/design/sp_sar.md's activation table, docs/design/parallel_layout.md's bytes per parameter
// and the memory figures Korthikanti et al. publish (docs/design/planner_sources.md).
#include <catch2/catch.hpp>

#include "planner/memory_breakdown.h"
#include "planner/memory_model.h"

using namespace loom::planner;

namespace {
ModelShape gpt(int L, int h, int a) {
  ModelShape m;
  m.num_layers = L; m.hidden_size = h; m.num_attention_heads = a;
  m.seq_length = 2048; m.vocab_size = 51200;
  return m;
}
constexpr double kGiB = 1073741824.0;
}  // namespace

TEST_CASE("per-layer activation bytes follow the docs/design/sp_sar.md table", "[planner]") {
  const ModelShape m = gpt(96, 12288, 96);
  const double s = 2048, b = 2, h = 12288, a = 96, t = 8;
  const double sbh = s * b * h;
  CHECK(layer_activation_bytes(m, 2, 1, false, RecomputeGranularity::kNone) == Approx(sbh * (34 + 5 * a * s / h)));
  CHECK(layer_activation_bytes(m, 2, 8, false, RecomputeGranularity::kNone) ==
        Approx(sbh * (10 + 24 / t + 5 * a * s / (h * t))));
  CHECK(layer_activation_bytes(m, 2, 8, true, RecomputeGranularity::kNone) == Approx(sbh * (34 / t + 5 * a * s / (h * t))));
  CHECK(layer_activation_bytes(m, 2, 8, false, RecomputeGranularity::kSelective) == Approx(sbh * (10 + 24 / t)));
  CHECK(layer_activation_bytes(m, 2, 8, true, RecomputeGranularity::kSelective) == Approx(sbh * 34 / t));
  CHECK(layer_activation_bytes(m, 2, 1, false, RecomputeGranularity::kFull) == Approx(2 * sbh));
  CHECK(layer_activation_bytes(m, 2, 8, true, RecomputeGranularity::kFull) == Approx(2 * sbh / t));
  // GPT-3: 5as/h = 80, TP alone at t=8 against TP+SP+SAR: (10+3+10)/4.25 ≈ 5.4x.
  CHECK(layer_activation_bytes(m, 1, 8, false, RecomputeGranularity::kNone) /
            layer_activation_bytes(m, 1, 8, true, RecomputeGranularity::kSelective) ==
        Approx(23.0 / 4.25));
}

TEST_CASE("in-flight micro-batches under 1F1B and interleaving", "[planner]") {
  CHECK(in_flight_chunks(8, 1, 64, 0) == 8);
  CHECK(in_flight_chunks(8, 1, 64, 7) == 1);
  CHECK(in_flight_chunks(8, 1, 3, 0) == 3);  // capped by the micro-batches
  // Interleaved: stage 0 holds L(1 + (p-1)/(pv)) layers = (pv + p - 1) chunks of L/(pv) layers.
  CHECK(in_flight_chunks(8, 3, 64, 0) == 8 * 3 + 8 - 1);
  CHECK(in_flight_chunks(35, 3, 280, 0) == 35 * 3 + 34);
}

TEST_CASE("bytes per parameter as Loom allocates them", "[planner]") {
  CHECK(bytes_per_param(Precision::kBf16, false, 8) == 18);
  CHECK(bytes_per_param(Precision::kBf16, true, 8) == Approx(6 + 12.0 / 8));
  // One fp32 gradient buffer for every model dtype: fp16 is bf16's 18 B (Megatron's fp16 keeps
  // a second, fp16 gradient copy: 20 B).
  CHECK(bytes_per_param(Precision::kFp16, false, 4) == 18);
  CHECK(bytes_per_param(Precision::kFp16, true, 4) == Approx(6 + 12.0 / 4));
}

TEST_CASE("layer params per rank sum to 12h2 + 13h over the TP group", "[planner]") {
  const ModelShape m = gpt(48, 6144, 64);
  const double h = 6144;
  // t ranks hold the split part once and the replicated 6h each.
  CHECK(layer_params_per_rank(m, 8) * 8 - 7 * 6 * h == Approx(12 * h * h + 13 * h));
}

TEST_CASE("Korthikanti et al memory figures per GPU", "[planner]") {
  // params+optimizer (18 B/param of the 12Lh^2 layer weights per GPU), activations with no
  // recompute (TP only) and with SP + selective, on the first stage (GiB, docs/design/planner_sources.md).
  struct Row { const char* name; int L, h, a, t, p, v, b, micro; double weights, none, sel; };
  const Row rows[] = {{"22B", 48, 6144, 64, 8, 1, 1, 4, 1, 45.6, 59.3, 9.6},
                      {"175B", 96, 12288, 96, 8, 8, 3, 1, 64, 45.6, 66.8, 12.4},
                      {"530B", 105, 20480, 128, 8, 35, 3, 1, 280, 31.6, 114.0, 23.1},
                      {"1T", 128, 25600, 160, 8, 64, 1, 1, 512, 33.0, 131.3, 26.6}};
  for (const auto& r : rows) {
    INFO(r.name);
    const ModelShape m = gpt(r.L, r.h, r.a);
    TrainingSetup setup;
    setup.global_batch = r.micro * r.b;
    Layout lay;
    lay.tp = r.t; lay.pp = r.p; lay.vp = r.v; lay.dp = 1; lay.micro_batch = r.b;
    // Layer weights of a middle stage (no embedding): 18 bytes per parameter.
    const double layer_weights = double(r.L / r.p) * layer_params_per_rank(m, r.t) * 18 / kGiB;
    CHECK(layer_weights == Approx(r.weights).margin(0.06));
    // The paper's accounting (2-byte activations, 1-byte masks) of the first stage's in-flight
    // chunks: what Megatron stores.
    const double layers_held = double(in_flight_chunks(r.p, r.v, r.micro, 0)) * (r.L / (r.p * r.v));
    CHECK(layers_held * layer_activation_bytes(m, r.b, r.t, false, RecomputeGranularity::kNone) / kGiB ==
          Approx(r.none).margin(0.06));
    CHECK(layers_held * layer_activation_bytes(m, r.b, r.t, true, RecomputeGranularity::kSelective) / kGiB ==
          Approx(r.sel).margin(0.06));
  }
}

TEST_CASE("stage memory terms for end stages and sharding and the reserve", "[planner]") {
  const ModelShape m = gpt(24, 2048, 16);
  TrainingSetup setup;
  setup.global_batch = 64;
  Layout lay;
  lay.tp = 2; lay.pp = 4; lay.dp = 4; lay.micro_batch = 2;
  const double cap = 80 * kGiB;
  const MemoryTerms first = stage_memory(m, setup, lay, 0, cap);
  const MemoryTerms middle = stage_memory(m, setup, lay, 1, cap);
  const MemoryTerms last = stage_memory(m, setup, lay, 3, cap);
  const double h = 2048, vocab = 51200 / 2;
  CHECK(first.weights_optimizer - middle.weights_optimizer == Approx((vocab * h + 2048 * h) * 18));
  CHECK(last.weights_optimizer - middle.weights_optimizer == Approx((vocab * h + 2 * h) * 18));
  CHECK(first.reserve == Approx(2 * kGiB + 0.05 * cap));
  // The terms are the breakdown's parts at the peak (memory_breakdown.h).
  for (int stage : {0, 1, 3}) {
    const StageBreakdown b = stage_breakdown(m, setup, lay, stage);
    const MemoryTerms t = stage_memory(m, setup, lay, stage, cap);
    CHECK(t.total() - t.reserve == Approx(b.peak()));
    CHECK(t.activations == Approx(b.at_peak.activations));
  }
  // The last stage's logits: at least the saved fp32 softmax 4·s·b·V/t.
  CHECK(last.embedding_logits >= 4.0 * 2048 * 2 * vocab);
  lay.distributed_optimizer = true;
  CHECK(stage_memory(m, setup, lay, 1, cap).weights_optimizer ==
        Approx(middle.weights_optimizer * (6 + 12.0 / 4) / 18));
  // Full recompute, uniform every 2 layers: ceil(6/2) = 3 stored inputs per in-flight micro-batch
  // (4 on stage 0), and 2 layers re-run in backward.
  lay.recompute.granularity = RecomputeGranularity::kFull;
  lay.recompute.method = RecomputeMethod::kUniform;
  lay.recompute.num_layers = 2;
  const StageBreakdown full = stage_breakdown(m, setup, lay, 0);
  const double input = loom_layer_activation_bytes(m, 2, 2, false, RecomputeGranularity::kFull, false, Precision::kBf16);
  const double layer = loom_layer_activation_bytes(m, 2, 2, false, RecomputeGranularity::kNone, false, Precision::kBf16);
  CHECK(input == Approx(2.0 * 2048 * 2 * h));
  REQUIRE(full.moment == PeakMoment::kBackward);
  CHECK(full.at_peak.activations == Approx(4 * 3 * input));
  CHECK(full.at_peak.recompute == Approx(2 * layer));
  // Block: 2 of 6 layers recomputed, 4 stored in full.
  lay.recompute.method = RecomputeMethod::kBlock;
  const StageBreakdown block = stage_breakdown(m, setup, lay, 0);
  CHECK(block.at_peak.activations == Approx(4 * (2 * input + 4 * layer)));
  CHECK(std::string(stage_memory(m, setup, lay, 0, cap).largest_term()) == "layer activations");
}
