// The planner models the attention software it plans for (docs/planner.md, "Fused attention"):
// with model.use_flash_attention the time model drops the s² softmax/dropout passes and costs the
// core at the fused-kernel efficiencies, the memory model stores no s×s activations, selective
// recompute is refused as it is by the recipe check, and the Hopper profile carries its own
// published efficiencies.
#include <catch2/catch.hpp>

#include "planner/memory_model.h"
#include "planner/search.h"
#include "planner/time_model.h"

using namespace loom::planner;

namespace {
ModelShape gpt(int L, int h, int a, int s) {
  ModelShape m;
  m.num_layers = L; m.hidden_size = h; m.num_attention_heads = a; m.seq_length = s;
  return m;
}
Cluster nodes(const char* gpu, int n) {
  Cluster c;
  c.gpu = find_gpu(gpu);
  c.num_nodes = n;
  c.gpus_per_node = 8;
  return c;
}
}  // namespace

TEST_CASE("fused attention: no s^2 memory-bound passes, the core at the fused kernel's efficiency", "[planner]") {
  const ModelShape m = gpt(32, 4096, 32, 4096);
  const Cluster c = nodes("H100", 1);
  const LayerCost unfused = layer_cost(m, c, 2, true, 1, 2, false);
  const LayerCost fused = layer_cost(m, c, 2, true, 1, 2, true);
  // The dense GEMMs and TP collectives do not change.
  CHECK(fused.fwd.gemm == Approx(unfused.fwd.gemm));
  CHECK(fused.bwd.comm == Approx(unfused.bwd.comm));
  // Memory-bound work loses the [b, a/t, s, s] passes: 9 B per score forward, 11 backward.
  const double scores = 1.0 * 32 / 2 * 4096.0 * 4096.0;
  const Efficiency& e = c.gpu.efficiency;
  const double bw = c.gpu.memory_bandwidth_gbs * 1e9 * e.memory_fraction;
  CHECK(unfused.fwd.memory - fused.fwd.memory == Approx(9 * scores / bw).epsilon(0.01));
  // Forward core: the causal tiles' FLOPs (4·(b·a/t)·s²·d_h·(s+128)/(2s)) at the forward fraction.
  const double flops = 4 * scores * 128 * (4096.0 + 128) / (2 * 4096.0);
  const double fill = 4096.0 / (4096.0 + e.gemm_half_dim);
  CHECK(fused.fwd.attention ==
        Approx(flops / (c.gpu.peak_tflops * 1e12 * e.fused_attention_fwd_fraction * fill) + e.kernel_launch_us * 1e-6));
  CHECK(fused.bwd.attention > 2.5 * fused.fwd.attention);  // 2.5x the FLOPs at a lower fraction
  CHECK(fused.fwd.total() < unfused.fwd.total());
  CHECK(fused.bwd.total() < unfused.bwd.total());
}

TEST_CASE("fused attention stores no s x s activations and refuses selective recompute", "[planner]") {
  const ModelShape m = gpt(24, 2048, 16, 4096);
  const double sbh = 4096.0 * 1 * 2048;
  // Unfused: sbh(34 + 5as/h); fused: sbh(34 + 4a/h) (the fp32 log-sum-exp), t = 1.
  CHECK(layer_activation_bytes(m, 1, 1, false, RecomputeGranularity::kNone) == Approx(sbh * (34 + 5.0 * 16 * 4096 / 2048)));
  CHECK(layer_activation_bytes(m, 1, 1, false, RecomputeGranularity::kNone, true) == Approx(sbh * (34 + 4.0 * 16 / 2048)));
  CHECK(layer_activation_bytes(m, 1, 1, false, RecomputeGranularity::kFull, true) == Approx(2 * sbh));

  Cluster c = nodes("H100", 1);
  TrainingSetup setup;
  setup.global_batch = 8;
  setup.fused_attention = true;
  Layout L;
  L.tp = 1; L.pp = 1; L.dp = 8; L.micro_batch = 1;
  L.recompute.granularity = RecomputeGranularity::kSelective;
  CHECK_THAT(check_layout(m, c, setup, L),
             Catch::Contains("model.activations_checkpoint_granularity: expected null or full with use_flash_attention"));
  L.recompute.granularity = RecomputeGranularity::kNone;
  CHECK(check_layout(m, c, setup, L).empty());
  // The search never offers selective with fused attention; without it, it does.
  SearchSpace space;
  space.tp = {1};
  space.pp = {1};
  SearchResult fused = search(m, c, setup, space, 1000);
  for (const auto& cand : fused.best) CHECK(cand.layout.recompute.granularity != RecomputeGranularity::kSelective);
  setup.fused_attention = false;
  SearchResult unfused = search(m, c, setup, space, 1000);
  bool selective = false;
  for (const auto& cand : unfused.best) selective = selective || cand.layout.recompute.granularity == RecomputeGranularity::kSelective;
  CHECK(selective);
  // The same layout without recompute needs less memory and time when fused.
  setup.fused_attention = true;
  const Candidate a = evaluate(m, c, setup, L);
  setup.fused_attention = false;
  const Candidate b = evaluate(m, c, setup, L);
  CHECK(a.memory.terms.activations < 0.5 * b.memory.terms.activations);
  CHECK(a.step_seconds() < b.step_seconds());
}

TEST_CASE("the Hopper profile carries its own published efficiencies", "[planner]") {
  const GpuSpec h100 = find_gpu("H100"), h200 = find_gpu("H200"), a100 = find_gpu("A100-80GB");
  CHECK(h100.efficiency.fused_attention_fwd_fraction == Approx(0.63));
  CHECK(h100.efficiency.fused_attention_bwd_fraction == Approx(0.52));
  CHECK(h200.efficiency.fused_attention_fwd_fraction == h100.efficiency.fused_attention_fwd_fraction);
  CHECK(a100.efficiency.fused_attention_fwd_fraction == Approx(0.70));
  CHECK(h100.peak_tflops > 3 * a100.peak_tflops);
  // A profile may set them; out-of-range values are refused naming the field.
  CHECK_THROWS_WITH(parse_gpu_table(R"({"name": "x", "peak_tflops": 1, "memory_gib": 1, "memory_bandwidth_gbs": 1,
                                        "intra_node_gbs": 1, "inter_node_gbs": 1,
                                        "efficiency": {"fused_attention_bwd_fraction": 1.5}})", "t.json"),
                    Catch::Contains("fractions must be <= 1"));
  const auto g = parse_gpu_table(R"({"name": "x", "peak_tflops": 1, "memory_gib": 1, "memory_bandwidth_gbs": 1,
                                     "intra_node_gbs": 1, "inter_node_gbs": 1,
                                     "efficiency": {"fused_attention_fwd_fraction": 0.4}})", "t.json");
  CHECK(g.at(0).efficiency.fused_attention_fwd_fraction == Approx(0.4));
}
