// `loom plan`: choose a parallel layout with the analytic planner (csrc/planner, docs/planner.md);
// `loom plan infer` plans inference; `loom plan calibrate` measures this machine for it.
// The front ends of `plan` and `plan infer` live in the torch-free planner (planner/cli.h,
// planner/inference_cli.h) so that loom_test_planner runs them in-process without torch
// (docs/architecture.md, "Commands"); `plan calibrate` is parsed here.
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <fstream>
#include <iostream>
#include <stdexcept>

#include "calibrate/calibrate.h"
#include "command_registry.h"
#include "launch/env_rendezvous.h"
#include "launch/local_launcher.h"
#include "planner/cli.h"
#include "planner/inference_cli.h"

namespace {

constexpr const char* kCalibrate = "loom plan calibrate";

// What `loom plan calibrate` was asked.
struct CalibrateArgs {
  int devices = 1;
  std::string accelerator = "cpu", dtype, out = "-";
  double target_seconds = 0.15, timeout_s = 300;
};

void add_calibrate_flags(CLI::App& app, CalibrateArgs& a) {
  app.add_option("--devices", a.devices, "Ranks to measure together (trainer.devices of the runs to plan)")
      ->capture_default_str();
  app.add_option("--accelerator", a.accelerator, "cpu or gpu")->capture_default_str();
  app.add_option("--dtype", a.dtype, "fp32, bf16 or fp16 (default: fp32 on cpu, bf16 on gpu)");
  app.add_option("--out", a.out, "Profile file to write ('-' = stdout)")->capture_default_str();
  app.add_option("--seconds", a.target_seconds, "Wall time per measurement")->capture_default_str();
  app.add_option("--timeout", a.timeout_s, "Seconds before a collective is declared stuck")->capture_default_str();
}

// The GEMM and copy element type of --dtype (default by --accelerator). Throws
// std::invalid_argument naming the flag for a value outside the choices or --devices < 1.
c10::ScalarType calibration_dtype(const CalibrateArgs& a) {
  if (a.accelerator != "cpu" && a.accelerator != "gpu")
    throw std::invalid_argument(fmt::format("--accelerator: expected cpu or gpu, found '{}'", a.accelerator));
  if (a.devices < 1) throw std::invalid_argument(fmt::format("--devices must be >= 1, found {}", a.devices));
  const std::string dtype = a.dtype.empty() ? (a.accelerator == "gpu" ? "bf16" : "fp32") : a.dtype;
  if (dtype == "fp32") return at::kFloat;
  if (dtype == "bf16") return at::kBFloat16;
  if (dtype == "fp16") return at::kHalf;
  throw std::invalid_argument(fmt::format("--dtype: expected fp32, bf16 or fp16, found '{}'", dtype));
}

// Rank 0's output: the profile to --out and a one-line summary on stderr.
void write_profile(const loom::calibrate::CalibrationResult& r, const std::string& out) {
  const std::string text = loom::calibrate::to_profile_json(r);
  if (out == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
  } else {
    std::ofstream f(out);
    if (!f || !(f << text)) throw std::runtime_error(fmt::format("{}: cannot write file", out));
  }
  double best_gemm = 0;
  for (const auto& g : r.gemm) best_gemm = std::max(best_gemm, g.tflops);
  std::cerr << fmt::format(
      "{}: {} x {} ({} {} threads each): best GEMM {:.3f} TFLOP/s, copy {:.1f} GB/s, op {:.1f} us", kCalibrate,
      r.ranks, r.device_name, r.dtype, r.threads_per_rank, best_gemm, r.copy_gbs, r.op_overhead_us);
  if (r.ranks > 1)
    std::cerr << fmt::format(", all-reduce {:.2f} GB/s bus, {:.1f} us per step", r.allreduce_busbw_gbs,
                             r.collective_latency_us);
  std::cerr << (out == "-" ? "\n" : fmt::format(" -> {}\n", out));
}

// One rank of the calibration (every rank measures; rank 0 writes). Returns 0, or 1 after
// recording the rank's error.
int run_calibration_rank(const CalibrateArgs& a, c10::ScalarType dtype, const loom::launch::RendezvousInfo& info) {
  using namespace loom;
  try {
    calibrate::CalibrationOptions opt;
    opt.dtype = dtype;
    opt.target_seconds = a.target_seconds;
    const calibrate::CalibrationResult r = calibrate::calibrate_on_rank(
        info, a.accelerator == "gpu" ? runtime::DeviceKind::kAccelerator : runtime::DeviceKind::kCpu,
        std::chrono::milliseconds(int64_t(a.timeout_s * 1000)), opt);
    if (info.rank == 0) write_profile(r, a.out);
    return 0;
  } catch (const std::exception& e) {
    launch::record_rank_error(e.what());
    std::cerr << kCalibrate << ": error: " << e.what() << "\n";
    return 1;
  }
}

// `loom plan calibrate`: starts --devices ranks of itself (like `loom train`) when no launcher
// started this process, else measures as one rank. Run it with the ranks per node that training
// will use, so that the GEMM rates include the sharing of cores (CPU) and the collectives span
// those ranks.
int calibrate_command(int argc, char** argv) {
  CLI::App app{
      "Measure this machine for the planner: GEMM TFLOP/s at several shapes, copy bandwidth, "
      "per-op overhead and all-reduce bandwidth/latency over N local ranks measured together. "
      "Writes the profile JSON that `loom plan --profile FILE` reads."};
  app.name(argc > 0 ? argv[0] : kCalibrate);
  CalibrateArgs args;
  add_calibrate_flags(app, args);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  c10::ScalarType dtype;
  loom::launch::RendezvousInfo info;
  try {
    dtype = calibration_dtype(args);
    info = loom::launch::rendezvous_from_env();
  } catch (const std::exception& e) {
    std::cerr << kCalibrate << ": " << e.what() << "\n";
    return 2;
  }
  if (info.source != loom::launch::RendezvousSource::kSingleProcess || args.devices == 1)
    return run_calibration_rank(args, dtype, info);
  loom::launch::LaunchOptions lo;
  lo.argv = {loom::launch::self_executable(), "plan", "calibrate"};
  for (int i = 1; i < argc; ++i) lo.argv.push_back(argv[i]);
  lo.nproc = args.devices;
  lo.timeout_s = args.timeout_s + 600;
  auto result = loom::launch::launch_local(lo);
  if (result.exit_code() != 0) std::cerr << kCalibrate << ": " << result.summary() << "\n";
  return result.exit_code();
}

// `loom plan ... --plot FILE.png`: the planner writes every layout that fits as CSV to
// FILE.csv (its --csv, with --keep raised to keep them all unless given) and
// tools/plot_plan.py draws step time against memory with the winner marked; plotting stays out
// of Loom's C++ (docs/planner.md, "Pictures"). The Python is $LOOM_PYTHON, else the repository's
// .venv, else python3; the script is found beside the executable's repository (build/bin/..).
struct PlotRequest {
  std::string png, csv;
  std::vector<std::string> args;  ///< the command line without --plot, with --csv/--keep added
};

std::optional<PlotRequest> plot_request(int argc, char** argv) {
  PlotRequest r;
  bool keep = false, csv = false;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--plot" && i + 1 < argc) {
      r.png = argv[++i];
    } else if (arg.rfind("--plot=", 0) == 0) {
      r.png = arg.substr(7);
    } else {
      if (arg == "--keep" || arg.rfind("--keep=", 0) == 0) keep = true;
      if (arg == "--csv" || arg.rfind("--csv=", 0) == 0) csv = true;
      r.args.push_back(arg);
    }
  }
  if (r.png.empty()) return std::nullopt;  // no picture: --csv is the plan's own flag
  if (csv) throw std::invalid_argument("--plot writes its own CSV (FILE.csv beside the picture): drop --csv");
  const std::filesystem::path png(r.png);
  r.csv = (png.parent_path() / (png.stem().string() + ".csv")).string();
  r.args.insert(r.args.end(), {"--csv", r.csv});
  if (!keep) r.args.insert(r.args.end(), {"--keep", "1000000"});
  return r;
}

int run_program(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return 127;
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return 127;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int plan_with_plot(const PlotRequest& r) {
  std::vector<std::string> args = r.args;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  const int rc = loom::planner::run_plan_command(static_cast<int>(argv.size()), argv.data());
  if (rc != 0) return rc;
  const std::filesystem::path repo = std::filesystem::path(loom::launch::self_executable()).parent_path() / ".." / "..";
  const std::string script = (repo / "tools" / "plot_plan.py").string();
  if (!std::filesystem::exists(script)) {
    std::cerr << "loom plan: --plot: " << script << " not found; the layouts are in " << r.csv
              << " (draw them with tools/plot_plan.py " << r.csv << " --output " << r.png << ")\n";
    return 1;
  }
  std::string python = std::getenv("LOOM_PYTHON") ? std::getenv("LOOM_PYTHON") : "";
  if (python.empty()) python = std::filesystem::exists(repo / ".venv/bin/python") ? (repo / ".venv/bin/python").string() : "python3";
  const int plot = run_program({python, script, r.csv, "--output", r.png});
  if (plot != 0) {
    std::cerr << "loom plan: --plot: " << python << " " << script << " failed (status " << plot
              << "; it needs matplotlib); the layouts are in " << r.csv << "\n";
    return 1;
  }
  return 0;
}

int plan_main(int argc, char** argv) {
  if (argc > 1 && !std::strcmp(argv[1], "calibrate")) {
    static char label[] = "loom plan calibrate";
    argv[1] = label;
    return calibrate_command(argc - 1, argv + 1);
  }
  if (argc > 1 && !std::strcmp(argv[1], "infer")) {
    static char label[] = "loom plan infer";
    argv[1] = label;
    return loom::planner::run_plan_inference_command(argc - 1, argv + 1);
  }
  try {
    if (const auto plot = plot_request(argc, argv)) return plan_with_plot(*plot);
  } catch (const std::invalid_argument& e) {
    std::cerr << "loom plan: " << e.what() << "\n";
    return 2;
  }
  return loom::planner::run_plan_command(argc, argv);
}

}  // namespace

LOOM_REGISTER_COMMAND("plan",
                      "choose a training layout (memory and speed model, layout search, --measure); "
                      "`plan calibrate` measures this machine, `plan infer` plans inference",
                      plan_main);
