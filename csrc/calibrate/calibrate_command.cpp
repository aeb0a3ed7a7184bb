// `loom plan calibrate`: starts the ranks (like `loom train`), measures, and rank 0 writes the
// profile. Run it with the number of ranks per node that training will use, so that the
// measured GEMM rates include the sharing of cores (CPU) and the collectives span those ranks.
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "calibrate/calibrate.h"
#include "launch/env_rendezvous.h"
#include "launch/local_launcher.h"
#include "runtime/cpu_threads.h"
#include "runtime/process_groups.h"

namespace loom::calibrate {

int run_calibrate_command(int argc, char** argv) {
  CLI::App app{
      "Measure this machine for the planner: GEMM TFLOP/s at several shapes, copy bandwidth, "
      "per-op overhead and all-reduce bandwidth/latency over N local ranks measured together. "
      "Writes the profile JSON that `loom plan --profile FILE` reads."};
  app.name(argc > 0 ? argv[0] : "loom plan calibrate");
  int devices = 1;
  std::string accelerator = "cpu", dtype, out = "-";
  double target = 0.15, timeout_s = 300;
  app.add_option("--devices", devices, "Ranks to measure together (trainer.devices of the runs to plan)")
      ->capture_default_str();
  app.add_option("--accelerator", accelerator, "cpu or gpu")->capture_default_str();
  app.add_option("--dtype", dtype, "fp32, bf16 or fp16 (default: fp32 on cpu, bf16 on gpu)");
  app.add_option("--out", out, "Profile file to write ('-' = stdout)")->capture_default_str();
  app.add_option("--seconds", target, "Wall time per measurement")->capture_default_str();
  app.add_option("--timeout", timeout_s, "Seconds before a collective is declared stuck")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  const char* me = "loom plan calibrate";
  if (accelerator != "cpu" && accelerator != "gpu") {
    std::cerr << me << ": --accelerator: expected cpu or gpu, found '" << accelerator << "'\n";
    return 2;
  }
  if (devices < 1) {
    std::cerr << me << ": --devices must be >= 1, found " << devices << "\n";
    return 2;
  }
  if (dtype.empty()) dtype = accelerator == "gpu" ? "bf16" : "fp32";
  c10::ScalarType scalar;
  if (dtype == "fp32") scalar = at::kFloat;
  else if (dtype == "bf16") scalar = at::kBFloat16;
  else if (dtype == "fp16") scalar = at::kHalf;
  else {
    std::cerr << me << ": --dtype: expected fp32, bf16 or fp16, found '" << dtype << "'\n";
    return 2;
  }

  launch::RendezvousInfo info;
  try {
    info = launch::rendezvous_from_env();
  } catch (const std::exception& e) {
    std::cerr << me << ": " << e.what() << "\n";
    return 2;
  }
  if (info.source == launch::RendezvousSource::kSingleProcess && devices > 1) {
    launch::LaunchOptions lo;
    lo.argv = {launch::self_executable(), "plan", "calibrate"};
    for (int i = 1; i < argc; ++i) lo.argv.push_back(argv[i]);
    lo.nproc = devices;
    lo.timeout_s = timeout_s + 600;
    auto result = launch::launch_local(lo);
    if (result.exit_code() != 0) std::cerr << me << ": " << result.summary() << "\n";
    return result.exit_code();
  }

  try {
    runtime::use_fair_share_of_cores(info.local_world_size);
    CalibrationOptions opt;
    opt.dtype = scalar;
    opt.target_seconds = target;
    runtime::ProcessGroupOptions pg;
    pg.timeout = std::chrono::milliseconds(int64_t(timeout_s * 1000));
    pg.device = runtime::select_run_device(
        accelerator == "gpu" ? runtime::DeviceKind::kAccelerator : runtime::DeviceKind::kCpu,
        info.local_rank);
    opt.device = pg.device.device;
    auto groups = runtime::ProcessGroups::create(info, pg);
    const CalibrationResult r = run_calibration(groups->world(), opt);
    if (groups->rank() == 0) {
      const std::string text = to_profile_json(r);
      if (out == "-") {
        std::fwrite(text.data(), 1, text.size(), stdout);
      } else {
        std::ofstream f(out);
        if (!f || !(f << text)) throw std::runtime_error(fmt::format("{}: cannot write file", out));
      }
      std::cerr << fmt::format(
          "{}: {} x {} ({} {} threads each): best GEMM {:.3f} TFLOP/s, copy {:.1f} GB/s, op {:.1f} us",
          me, r.ranks, r.device_name, r.dtype, r.threads_per_rank,
          [&] { double b = 0; for (auto& g : r.gemm) b = std::max(b, g.tflops); return b; }(),
          r.copy_gbs, r.op_overhead_us);
      if (r.ranks > 1)
        std::cerr << fmt::format(", all-reduce {:.2f} GB/s bus, {:.1f} us per step", r.allreduce_busbw_gbs,
                                 r.collective_latency_us);
      std::cerr << (out == "-" ? "\n" : fmt::format(" -> {}\n", out));
    }
    groups->shutdown();
    return 0;
  } catch (const std::exception& e) {
    launch::record_rank_error(e.what());
    std::cerr << me << ": error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace loom::calibrate
