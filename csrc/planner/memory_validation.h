// `loom plan --validate-memory`: the planner's memory per pipeline stage checked against what
// Loom allocates. Each case trains a few steps of the --recipe's model on a device whose
// allocator keeps exact counts (the stand-in device through LOOM_DEVICE_PLUGIN, or CUDA's
// caching allocator) through the same launcher as `--measure` (planner/measure.h), reads the
// last step's mem_peak_bytes_by_stage and mem_after_step_bytes_by_stage from metrics.jsonl and
// sets them beside planner/memory_breakdown.h's prediction of the same two moments (no
// reserve: it is not allocated by tensors). docs/planner.md, "Memory model" and "Checking the
// memory model".
#pragma once
#include <string>
#include <vector>

#include "config/recipe.h"
#include "planner/layout.h"
#include "planner/measure.h"
#include "planner/memory_breakdown.h"
#include "planner/model_shape.h"

namespace loom::planner {

/// One run of the sweep: a layout with its settings.
struct MemoryCase {
  std::string name;  ///< unique, e.g. "t2p1d1-b2m2-fp32-sp-sel"
  Layout layout;     ///< t, p, v, d, b, global batch, SP, recompute, distributed optimizer
  Precision precision = Precision::kFp32;
  bool fused_attention = false;       ///< model.use_flash_attention (attention dropout set to 0)
  std::string optimizer = "adamw";    ///< model.optim.name: adamw, fused_adam or distributed_fused_adam
  bool ci = false;                    ///< in the CI subset
};

/// The sweep's cases: a hand-picked covering sample of t ∈ {1,2}, p ∈ {1,2} with and without
/// interleaving, d ∈ {1,2} with and without the distributed optimizer, SP on/off, recompute
/// none/selective/full (uniform and block), fused attention on/off, fp32/bf16/fp16, micro-batch
/// sizes 1, 2, 4 and 1–4 micro-batches per step, every value of every factor at least twice,
/// worlds of at most 4 ranks (docs/planner.md lists them). `ci` marks the subset CI runs.
std::vector<MemoryCase> memory_cases();

/// The cases named by `selection`: "all", "ci", "one-rank" (the cases of world 1: what one GPU
/// runs at real shapes in the bring-up), or a comma list of names. Throws
/// std::invalid_argument naming an unknown case.
std::vector<MemoryCase> select_memory_cases(const std::string& selection);

/// Dotted overrides that train `c` on the recipe's model and data on the accelerator.
std::vector<std::string> memory_case_overrides(const MemoryCase& c, const config::Recipe& base);

/// The planner's setup for `c`: the recipe's batch and buckets with the case's precision, fused
/// attention and optimizer (its update kernel: per tensor for adam/adamw, ATen's fused kernel for
/// fused_adam on CUDA, for-each ops elsewhere).
TrainingSetup memory_case_setup(const MemoryCase& c, const config::Recipe& base, bool cuda);

/// One stage of one case.
struct MemoryRow {
  std::string case_name;
  int stage = 0;
  StageBreakdown predicted;
  double measured_peak = 0, measured_after = 0;  ///< bytes, the stage's largest rank
  double peak_error() const { return (predicted.peak() - measured_peak) / measured_peak; }
  double after_error() const { return (predicted.after_step() - measured_after) / measured_after; }
};

/// What the sweep found: rows of the runs that succeeded, and the failures.
struct MemorySweep {
  std::vector<MemoryRow> rows;
  std::vector<std::string> failures;  ///< "<case>: <status>: <detail>"
  double mean_abs_peak_error() const;
  double worst_abs_peak_error() const;
  /// Every peak row within `row_target` and the mean within `mean_target` (relative), no failure.
  bool meets(double row_target = 0.05, double mean_target = 0.02) const;
};

struct MemorySweepOptions {
  MeasureOptions measure;  ///< loom executable, recipe path and overrides, steps, timeout, dir
  bool cuda = false;       ///< the accelerator is CUDA (else a device plugin: the stand-in)
};

/// Runs `cases` one after the other (progress on stderr) and compares each stage.
MemorySweep run_memory_sweep(const MemorySweepOptions& options, const config::Recipe& base, const ModelShape& shape,
                             const std::vector<MemoryCase>& cases);

/// The rows compared with the measurement of one case (`stages` from its metrics.jsonl).
std::vector<MemoryRow> compare_case(const MemoryCase& c, const ModelShape& shape, const TrainingSetup& setup,
                                    const StepMemoryRecord& measured);

/// The table: case, stage, moment, predicted parts (MiB), predicted and measured peak and
/// after-step (MiB) and their errors, then the mean and worst |peak error| and the target.
std::string format_memory_sweep(const MemorySweep& sweep);

}  // namespace loom::planner
