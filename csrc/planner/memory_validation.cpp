#include "planner/memory_validation.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "planner/recipe_input.h"

namespace loom::planner {
namespace {

constexpr double kMiB = 1048576.0;

// "t2p1d1-b2m2-fp32-sp-sel" style names, from the case's own settings.
struct Spec {
  int t = 1, p = 1, v = 1, d = 1, b = 1, m = 1;
  bool sp = false;
  RecomputeGranularity recompute = RecomputeGranularity::kNone;
  RecomputeMethod method = RecomputeMethod::kNone;
  int recompute_layers = 0;
  bool dist = false;
  Precision precision = Precision::kFp32;
  bool fused = false;
  std::string optimizer = "adamw";
  bool ci = false;
};

const char* precision_name(Precision p) {
  return p == Precision::kFp32 ? "fp32" : p == Precision::kBf16 ? "bf16" : "fp16";
}

MemoryCase make_case(const Spec& s) {
  MemoryCase c;
  Layout& L = c.layout;
  L.tp = s.t;
  L.pp = s.p;
  L.vp = s.v;
  L.dp = s.d;
  L.micro_batch = s.b;
  L.global_batch = int64_t(s.b) * s.m * s.d;
  L.sequence_parallel = s.sp && s.t > 1;
  L.recompute.granularity = s.recompute;
  L.recompute.method = s.method;
  if (s.recompute == RecomputeGranularity::kFull) L.recompute.num_layers = s.recompute_layers;
  L.distributed_optimizer = s.dist;
  c.precision = s.precision;
  c.fused_attention = s.fused;
  c.optimizer = s.dist && s.optimizer == "fused_adam" ? "distributed_fused_adam" : s.optimizer;
  c.ci = s.ci;
  std::string recompute = s.recompute == RecomputeGranularity::kNone        ? "none"
                          : s.recompute == RecomputeGranularity::kSelective ? "sel"
                          : fmt::format("full-{}{}", s.method == RecomputeMethod::kBlock ? "block" : "uni",
                                        s.recompute_layers);
  c.name = fmt::format("t{}p{}{}d{}-b{}m{}-{}{}-{}{}{}{}", s.t, s.p, s.v > 1 ? fmt::format("v{}", s.v) : "", s.d, s.b,
                       s.m, precision_name(s.precision), L.sequence_parallel ? "-sp" : "", recompute,
                       s.fused ? "-flash" : "", s.dist ? "-dopt" : "", s.optimizer == "fused_adam" ? "-fused" : "");
  return c;
}

// A case written as words: tN pN vN dN bN (micro-batch size) mN (micro-batches), fp32|bf16|fp16,
// sp, sel | full-uniK | full-blockK, flash, dopt, fused (fused_adam), ci.
Spec parse_spec(const std::string& words) {
  Spec s;
  std::istringstream in(words);
  std::string w;
  while (in >> w) {
    const auto number = [&](size_t from) { return std::stoi(w.substr(from)); };
    if (w == "fp32") s.precision = Precision::kFp32;
    else if (w == "bf16") s.precision = Precision::kBf16;
    else if (w == "fp16") s.precision = Precision::kFp16;
    else if (w == "sp") s.sp = true;
    else if (w == "sel") s.recompute = RecomputeGranularity::kSelective;
    else if (w.rfind("full-uni", 0) == 0 || w.rfind("full-block", 0) == 0) {
      s.recompute = RecomputeGranularity::kFull;
      const bool block = w.rfind("full-block", 0) == 0;
      s.method = block ? RecomputeMethod::kBlock : RecomputeMethod::kUniform;
      s.recompute_layers = number(block ? 10 : 8);
    } else if (w == "flash") s.fused = true;
    else if (w == "dopt") s.dist = true;
    else if (w == "fused") s.optimizer = "fused_adam";
    else if (w == "ci") s.ci = true;
    else if (w.size() > 1 && std::string("tpvdbm").find(w[0]) != std::string::npos) {
      int& field = w[0] == 't' ? s.t : w[0] == 'p' ? s.p : w[0] == 'v' ? s.v : w[0] == 'd' ? s.d : w[0] == 'b' ? s.b : s.m;
      field = number(1);
    } else {
      throw std::logic_error("memory case '" + words + "': unknown word '" + w + "'");
    }
  }
  return s;
}

}  // namespace

std::vector<MemoryCase> memory_cases() {
  static const char* const kCases[] = {
      // One rank: every recompute setting, precision, fused attention, micro-batch size.
      "b1 m1 fp32 ci",
      "b4 m1 fp32 sel",
      "b2 m2 bf16",
      "b2 m2 fp16 full-uni1",
      "b2 m1 fp32 flash",
      "b2 m2 bf16 full-block2 flash",
      "b4 m2 bf16 fused",
      // Tensor parallel, with and without SP.
      "t2 b2 m2 fp32 sp sel ci",
      "t2 b2 m1 bf16",
      "t2 b1 m2 fp32 sp full-uni2 flash",
      // Pipeline: 1F1B and interleaved.
      "p2 b1 m4 fp32 ci",
      "p2 b2 m4 bf16 sel",
      "p2 v2 b1 m4 fp32",
      "p2 v2 b2 m2 bf16 full-uni1",
      // Data parallel, plain and distributed optimizer.
      "d2 b2 m2 fp32",
      "d2 b2 m2 fp32 dopt",
      "d2 b1 m4 bf16 dopt fused",
      "d2 b2 m1 fp16 dopt ci",
      // Combinations (worlds of 4).
      "t2 p2 b2 m4 fp32 sp sel",
      "t2 p2 b1 m2 bf16 flash",
      "p2 d2 b1 m2 fp32 sel dopt",
      "t2 d2 b2 m2 bf16 sp dopt fused",
      "t2 p2 v2 b1 m4 fp32 sp full-uni1",
      "p2 d2 b2 m2 fp16 fused",
  };
  std::vector<MemoryCase> out;
  for (const char* words : kCases) out.push_back(make_case(parse_spec(words)));
  return out;
}

std::vector<MemoryCase> select_memory_cases(const std::string& selection) {
  const auto all = memory_cases();
  if (selection == "all") return all;
  std::vector<MemoryCase> out;
  if (selection == "ci" || selection == "one-rank") {
    for (const auto& c : all)
      if (selection == "ci" ? c.ci : c.layout.world_size() == 1) out.push_back(c);
    return out;
  }
  std::istringstream in(selection);
  std::string name;
  while (std::getline(in, name, ',')) {
    auto it = std::find_if(all.begin(), all.end(), [&](const MemoryCase& c) { return c.name == name; });
    if (it == all.end()) {
      std::string names;
      for (const auto& c : all) names += " " + c.name;
      throw std::invalid_argument(fmt::format(
          "--validate-memory-cases: unknown case '{}' (expected all, ci, one-rank or a comma list of:{})", name, names));
    }
    out.push_back(*it);
  }
  if (out.empty()) throw std::invalid_argument("--validate-memory-cases: no case named");
  return out;
}

std::vector<std::string> memory_case_overrides(const MemoryCase& c, const config::Recipe& base) {
  (void)base;
  std::vector<std::string> o = {
      "trainer.accelerator=gpu",
      fmt::format("trainer.devices={}", c.layout.world_size()),
      fmt::format("model.global_batch_size={}", c.layout.global_batch),
      std::string("trainer.precision=") + (c.precision == Precision::kFp32   ? "32"
                                           : c.precision == Precision::kBf16 ? "bf16"
                                                                             : "16"),
      std::string("model.use_flash_attention=") + (c.fused_attention ? "true" : "false"),
      "model.optim.name=" + c.optimizer,
  };
  if (c.fused_attention) o.push_back("model.attention_dropout=0.0");
  return o;
}

TrainingSetup memory_case_setup(const MemoryCase& c, const config::Recipe& base, bool cuda) {
  TrainingSetup setup;
  setup.global_batch = int(c.layout.global_batch);
  setup.precision = c.precision;
  setup.fused_attention = c.fused_attention;
  setup.attention_dropout = !c.fused_attention && base.model.attention_dropout > 0;  // the case sets 0 when fused
  setup.dp_bucket_params = double(base.model.optim.ddp_bucket_size.value_or(0));
  setup.overlap_param_gather = base.model.optim.overlap_param_sync && c.layout.distributed_optimizer;
  setup.overlap_dp_comm = base.model.optim.overlap_grad_sync;
  const bool multi_tensor = c.optimizer == "fused_adam" || c.optimizer == "distributed_fused_adam";
  setup.optimizer_update = !multi_tensor ? OptimizerUpdate::kPerTensor
                           : cuda        ? OptimizerUpdate::kFused
                                         : OptimizerUpdate::kForEach;
  return setup;
}

std::vector<MemoryRow> compare_case(const MemoryCase& c, const ModelShape& shape, const TrainingSetup& setup,
                                    const StepMemoryRecord& measured) {
  std::vector<MemoryRow> rows;
  const auto predicted = every_stage_breakdown(shape, setup, c.layout);
  for (const auto& stage : predicted) {
    if (size_t(stage.stage) >= measured.peak.size()) break;
    MemoryRow row;
    row.case_name = c.name;
    row.stage = stage.stage;
    row.predicted = stage;
    row.measured_peak = measured.peak[size_t(stage.stage)];
    row.measured_after = measured.after_step[size_t(stage.stage)];
    rows.push_back(row);
  }
  return rows;
}

double MemorySweep::mean_abs_peak_error() const {
  if (rows.empty()) return 0;
  double sum = 0;
  for (const auto& r : rows) sum += std::abs(r.peak_error());
  return sum / double(rows.size());
}

double MemorySweep::worst_abs_peak_error() const {
  double worst = 0;
  for (const auto& r : rows) worst = std::max(worst, std::abs(r.peak_error()));
  return worst;
}

bool MemorySweep::meets(double row_target, double mean_target) const {
  return failures.empty() && !rows.empty() && worst_abs_peak_error() <= row_target &&
         mean_abs_peak_error() <= mean_target;
}

MemorySweep run_memory_sweep(const MemorySweepOptions& options, const config::Recipe& base, const ModelShape& shape,
                             const std::vector<MemoryCase>& cases) {
  MemorySweep sweep;
  for (size_t i = 0; i < cases.size(); ++i) {
    const MemoryCase& c = cases[i];
    MeasureOptions mo = options.measure;
    mo.run_overrides = memory_case_overrides(c, base);
    mo.run_name = c.name;
    mo.nproc = int(c.layout.world_size());
    std::fprintf(stderr, "[memory %zu/%zu] %s ...", i + 1, cases.size(), c.name.c_str());
    std::fflush(stderr);
    const Measurement m = measure_layout(mo, base, c.layout, int(i));
    if (m.status != RunStatus::ok) {
      sweep.failures.push_back(fmt::format("{}: {}: {}", c.name, to_string(m.status), m.detail));
      std::fprintf(stderr, " %s: %s\n", to_string(m.status), m.detail.c_str());
      continue;
    }
    if (m.step_memory.peak.size() != size_t(c.layout.pp)) {
      sweep.failures.push_back(fmt::format(
          "{}: metrics.jsonl has no per-stage device memory for {} stages (a device whose allocator keeps "
          "statistics is needed: CUDA, or the stand-in through LOOM_DEVICE_PLUGIN)",
          c.name, c.layout.pp));
      std::fprintf(stderr, " no device memory in metrics.jsonl\n");
      continue;
    }
    const auto rows = compare_case(c, shape, memory_case_setup(c, base, options.cuda), m.step_memory);
    double worst = 0;
    for (const auto& r : rows) worst = std::max(worst, std::abs(r.peak_error()));
    std::fprintf(stderr, " ok (%.1f s, worst stage %.2f%%)\n", m.wall_seconds, 100 * worst);
    sweep.rows.insert(sweep.rows.end(), rows.begin(), rows.end());
  }
  return sweep;
}

std::string format_memory_sweep(const MemorySweep& sweep) {
  std::string s =
      "| case | stage | moment | states MiB | activations MiB | recompute MiB | logits MiB | grads MiB | "
      "comm MiB | workspace MiB | predicted peak MiB | measured peak MiB | peak error | predicted after MiB | "
      "measured after MiB | after error |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : sweep.rows) {
    const auto& p = r.predicted;
    const auto& a = p.at_peak;
    s += fmt::format(
        "| {} | {} | {} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:+.2f}% | "
        "{:.2f} | {:.2f} | {:+.2f}% |\n",
        r.case_name, r.stage, to_string(p.moment), p.states.total() / kMiB, a.activations / kMiB,
        a.recompute / kMiB, a.logits / kMiB, a.grads / kMiB, a.communication / kMiB, a.workspace / kMiB,
        p.peak() / kMiB, r.measured_peak / kMiB, 100 * r.peak_error(), p.after_step() / kMiB,
        r.measured_after / kMiB, 100 * r.after_error());
  }
  s += fmt::format("\n{} stage rows of {} runs; peak |error| mean {:.2f}%, worst {:.2f}% (target: every row within "
                   "5%, mean within 2%): {}\n",
                   sweep.rows.size(),
                   [&] {
                     std::map<std::string, int> runs;
                     for (const auto& r : sweep.rows) runs[r.case_name] = 1;
                     return runs.size();
                   }(),
                   100 * sweep.mean_abs_peak_error(), 100 * sweep.worst_abs_peak_error(),
                   sweep.meets() ? "met" : "NOT met");
  for (const auto& f : sweep.failures) s += "failed: " + f + "\n";
  return s;
}

}  // namespace loom::planner
