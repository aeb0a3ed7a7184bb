// GPU table, user tables, measured profiles and the GEMM-curve fit.
#include <catch2/catch.hpp>

#include <cmath>

#include "planner/hardware.h"
#include "planner/time_model.h"

using namespace loom::planner;

TEST_CASE("built-in GPU table", "[planner]") {
  const auto& gpus = builtin_gpus();
  REQUIRE(gpus.size() == 4);
  const GpuSpec a100 = find_gpu("a100-80gb");
  CHECK(a100.name == "A100-80GB");
  CHECK(a100.peak_tflops == 312);
  CHECK(a100.memory_gib == 80);
  CHECK(a100.memory_bandwidth_gbs == 2039);
  CHECK(a100.intra_node_gbs == 300);
  CHECK(a100.inter_node_gbs == 25);
  CHECK(a100.efficiency.gemm_max_fraction == 0.78);
  CHECK(find_gpu("A100-40GB").memory_gib == 40);
  CHECK(find_gpu("H100").peak_tflops == 989);
  CHECK(find_gpu("H200").memory_gib == 140);
  CHECK_THROWS_WITH(find_gpu("V100"), Catch::Contains("known: A100-40GB"));
}

TEST_CASE("user GPU tables accept any memory size and named or inline efficiency and give clear errors", "[planner]") {
  const std::string table = R"({"gpus": [{"name": "L40S", "peak_tflops": 362, "memory_gib": 48,
      "memory_bandwidth_gbs": 864, "intra_node_gbs": 32, "inter_node_gbs": 25, "gpus_per_node": 4,
      "efficiency": {"gemm_max_fraction": 0.6}}]})";
  const auto gpus = parse_gpu_table(table, "my.json");
  REQUIRE(gpus.size() == 1);
  CHECK(gpus[0].memory_gib == 48);
  CHECK(gpus[0].gpus_per_node == 4);
  CHECK(gpus[0].efficiency.gemm_max_fraction == 0.6);
  CHECK(gpus[0].efficiency.memory_fraction == Efficiency{}.memory_fraction);
  CHECK(find_gpu("l40s", gpus).peak_tflops == 362);
  CHECK_THROWS_WITH(parse_gpu_table(R"({"gpus": [{"name": "X", "peak_tflops": 1}]})", "my.json"),
                    Catch::Contains("my.json: gpus[0] (GPU 'X'): missing field 'memory_gib'"));
  CHECK_THROWS_WITH(parse_gpu_table("{oops", "bad.json"), Catch::Contains("bad.json: invalid JSON"));
  CHECK_THROWS_WITH(
      parse_gpu_table(R"({"name": "X", "peak_tflops": 1, "memory_gib": 1, "memory_bandwidth_gbs": 1,
                         "intra_node_gbs": 1, "inter_node_gbs": 1, "efficiency": {"gemm_speed": 1}})", "u.json"),
      Catch::Contains("unknown efficiency field 'gemm_speed'"));
}

TEST_CASE("fit_gemm_curve recovers the curve from measured samples", "[planner]") {
  GpuSpec truth = find_gpu("A100-80GB");
  truth.efficiency.gemm_max_fraction = 0.7;
  truth.efficiency.gemm_half_dim = 100;
  std::vector<GemmSample> samples;
  for (double m : {256.0, 1024.0, 8192.0})
    for (double k : {128.0, 2048.0}) {
      // Exact throughput of the model (no launch cost): the curve's compute time plus the bf16
      // result write at the memory-bound bandwidth, which the fit must take out again.
      const double eff = 0.7 * (m / (m + 100)) * (4096 / (4096 + 100.0)) * (k / (k + 100));
      const double flops = 2 * m * 4096 * k;
      const double seconds = flops / (312e12 * eff) + 2 * m * 4096 / (2039e9 * 0.65);
      samples.push_back({m, 4096, k, flops / seconds / 1e12});
    }
  GpuSpec start = find_gpu("A100-80GB");
  const GpuSpec fitted = fit_gemm_curve(start, samples);
  CHECK(fitted.efficiency.gemm_max_fraction == Approx(0.7).epsilon(0.01));
  CHECK(fitted.efficiency.gemm_half_dim == Approx(100).epsilon(0.01));
  CHECK_THROWS(fit_gemm_curve(start, {samples[0]}));
}

TEST_CASE("a measured profile replaces the built-in efficiencies", "[planner]") {
  const GpuSpec base = find_gpu("A100-80GB");
  const GpuSpec g = apply_measured_profile(
      base, R"({"memory_bandwidth_gbs": 1500, "allreduce_busbw_gbs": {"intra_node": 210, "inter_node": 20}})",
      "prof.json");
  CHECK(g.efficiency.memory_fraction == Approx(1500.0 / 2039));
  CHECK(g.efficiency.intra_node_comm_fraction == Approx(210.0 / 300));
  CHECK(g.efficiency.inter_node_comm_fraction == Approx(20.0 / 25));
  CHECK(g.efficiency.gemm_max_fraction == base.efficiency.gemm_max_fraction);
  CHECK_THROWS_WITH(apply_measured_profile(base, R"({"gemm": [{"m": 1, "n": 2}]})", "prof.json"),
                    Catch::Contains("prof.json: gemm[0]: missing field 'k'"));
}

TEST_CASE("primitive costs follow their formulas", "[planner]") {
  const GpuSpec g = find_gpu("A100-80GB");
  const Efficiency& e = g.efficiency;
  const double M = 8192, N = 2304, K = 6144;
  const double x0 = e.gemm_half_dim;
  const double eff = e.gemm_max_fraction * (M / (M + x0)) * (N / (N + x0)) * (K / (K + x0));
  // Compute on the shape curve, the bf16 result C[M,N] written at the memory-bound bandwidth, launch.
  CHECK(gemm_seconds(g, M, N, K) == Approx(2 * M * N * K / (312e12 * eff) + 2 * M * N / (2039e9 * 0.65) + 4e-6));
  CHECK(gemm_seconds(g, M, N, K, 4) - gemm_seconds(g, M, N, K) == Approx(2 * M * N / (2039e9 * 0.65)));
  CHECK(memory_seconds(g, 1e9, 2) == Approx(1e9 / (2039e9 * 0.65) + 8e-6));
  Cluster c;
  c.gpu = g;
  c.num_nodes = 4;
  c.gpus_per_node = 8;
  // Inside a node: NVLink at 80%; one member per node (stride 8): one NIC at 70%;
  // 8 members per node: 8 NICs (200 GB/s) at 70%.
  CHECK(group_bus_gbs(c, 8, 1) == Approx(240));
  CHECK(group_bus_gbs(c, 4, 8) == Approx(17.5));
  CHECK(group_bus_gbs(c, 32, 1) == Approx(140));
  const double bytes = 100e6;
  CHECK(collective_seconds(c, Collective::all_reduce, bytes, 8, 1) ==
        Approx(2.0 * 7 / 8 * bytes / 240e9 + 14 * 10e-6));
  CHECK(collective_seconds(c, Collective::all_gather, bytes, 8, 1) ==
        Approx(7.0 / 8 * bytes / 240e9 + 7 * 10e-6));
  CHECK(collective_seconds(c, Collective::reduce_scatter, bytes, 1, 1) == 0);
}
