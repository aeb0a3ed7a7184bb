// Calibration: the ring-model fit recovers known parameters, and a real one-rank calibration
// produces a profile the planner accepts as its device.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include "calibrate/calibrate.h"
#include "planner/hardware.h"
#include "runtime/communicator.h"

using namespace loom::calibrate;

TEST_CASE("the ring fit recovers latency and bandwidth from exact samples of all three kinds", "[calibrate]") {
  const double alpha = 300e-6, bw = 1.5e9;  // per ring step; bytes/s
  const int n = 4;
  std::vector<CollectiveSample> samples;
  for (double bytes : {65536.0, 1048576.0, 16777216.0}) {
    samples.push_back({CollectiveKind::all_reduce, int64_t(bytes), 2 * (n - 1) * alpha + 2.0 * (n - 1) / n * bytes / bw});
    samples.push_back({CollectiveKind::all_gather, int64_t(bytes), (n - 1) * alpha + double(n - 1) / n * bytes / bw});
    samples.push_back({CollectiveKind::reduce_scatter, int64_t(bytes), (n - 1) * alpha + double(n - 1) / n * bytes / bw});
  }
  const RingFit fit = fit_ring_model(samples, n);
  CHECK(fit.latency_s == Approx(alpha).epsilon(1e-9));
  CHECK(fit.bus_gbs == Approx(bw / 1e9).epsilon(1e-9));
  CHECK_THROWS_AS(fit_ring_model({samples.front()}, n), std::invalid_argument);
}

TEST_CASE("the ring fit stays physical when the samples fall with size", "[calibrate]") {
  // Noise can make a larger message faster: the fit must still give positive parameters.
  std::vector<CollectiveSample> samples = {{CollectiveKind::all_reduce, 65536, 2e-3},
                                           {CollectiveKind::all_reduce, 1048576, 1e-3}};
  const RingFit fit = fit_ring_model(samples, 2);
  CHECK(fit.latency_s > 0);
  CHECK(fit.bus_gbs > 0);
}

TEST_CASE("a one-rank CPU calibration gives a profile the planner takes as its device", "[calibrate]") {
  auto solo = loom::runtime::Communicator::solo();
  CalibrationOptions opt;
  opt.target_seconds = 0.01;
  opt.gemm_shapes = {{64, 64, 64}, {256, 256, 256}, {256, 1024, 64}};
  const CalibrationResult r = run_calibration(*solo, opt);
  CHECK(r.device_name == "cpu");
  CHECK(r.dtype == "fp32");
  CHECK(r.ranks == 1);
  REQUIRE(r.gemm.size() == 3);
  for (const auto& g : r.gemm) CHECK(g.tflops > 0);
  CHECK(r.copy_gbs > 0);
  CHECK(r.op_overhead_us > 0);
  CHECK(r.collectives.empty());  // one rank: nothing to measure
  const std::string json = to_profile_json(r);
  const auto gpu = loom::planner::apply_measured_profile(loom::planner::find_gpu("A100-80GB"), json, "cpu.json");
  CHECK(gpu.name == "cpu-1x" + std::to_string(r.threads_per_rank) + "t");
  double best = 0;
  for (const auto& g : r.gemm) best = std::max(best, g.tflops);
  CHECK(gpu.peak_tflops == Approx(best));
  CHECK(gpu.memory_bandwidth_gbs == Approx(r.copy_gbs));
  CHECK(gpu.efficiency.kernel_launch_us == Approx(r.op_overhead_us));
  CHECK(gpu.efficiency.comm_overlap_fraction == 0);
  CHECK(gpu.efficiency.gemm_max_fraction > 0);
  CHECK(gpu.efficiency.gemm_max_fraction <= 1);
}

TEST_CASE("calibration measures the fused attention kernel and the profile sets its efficiencies", "[calibrate]") {
  auto solo = loom::runtime::Communicator::solo();
  CalibrationOptions opt;
  opt.target_seconds = 0.01;
  opt.gemm_shapes = {{128, 128, 128}, {256, 256, 256}};
  opt.attention_shapes = {{1, 2, 128, 32}, {1, 2, 256, 32}};
  const CalibrationResult r = run_calibration(*solo, opt);
  REQUIRE(r.attention.size() == 2);
  for (const auto& a : r.attention) {
    CHECK(a.fwd_tflops > 0);
    CHECK(a.bwd_tflops > 0);
    CHECK(a.head_dim == 32);
  }
  CHECK(r.attention[1].seq == 256);
  const std::string json = to_profile_json(r);
  CHECK(json.find("\"fused_attention\"") != std::string::npos);
  const auto gpu = loom::planner::apply_measured_profile(loom::planner::find_gpu("A100-80GB"), json, "cpu.json");
  // The fractions are the samples' mean of achieved / (peak · seq/(seq + x0)), at most 1.
  double fwd = 0;
  for (const auto& a : r.attention)
    fwd += a.fwd_tflops / (gpu.peak_tflops * double(a.seq) / (double(a.seq) + gpu.efficiency.gemm_half_dim));
  CHECK(gpu.efficiency.fused_attention_fwd_fraction == Approx(std::min(1.0, fwd / 2)));
  CHECK(gpu.efficiency.fused_attention_bwd_fraction > 0);
  CHECK(gpu.efficiency.fused_attention_bwd_fraction <= 1);
  // A profile's sample without its fields is refused naming it.
  CHECK_THROWS_WITH(loom::planner::apply_measured_profile(loom::planner::find_gpu("A100-80GB"),
                                                          R"({"fused_attention": [{"seq": 128}]})", "p.json"),
                    Catch::Contains("p.json: fused_attention[0]: missing field 'fwd_tflops'"));
}
