// The planner checked against published measurements (docs/design/planner_sources.md, "Published results"):
// Korthikanti et al. 2022 iteration times (full recompute and SP + selective, 4 models) and
// Narayanan et al. 2021 Table 1 TFLOP/s per GPU (full recompute, 10 models), all on
// A100-80GB DGX nodes (8 GPUs, NVLink inside, 8×200 Gb/s InfiniBand across), s = 2048, V = 51200.
#pragma once
#include <string>
#include <vector>

#include "planner/hardware.h"
#include "planner/search.h"

namespace loom::planner {

struct PublishedRow {
  std::string source;  ///< "Korthikanti 2022" or "Narayanan 2021"
  std::string label;   ///< e.g. "175B full recompute"
  ModelShape shape;
  int gpus = 0, tp = 1, pp = 1, global_batch = 0;
  int vp = 0;           ///< virtual stages; 0 = not published, the planner chooses
  int micro_batch = 0;  ///< 0 = not published, the planner chooses
  bool sequence_parallel = false;
  RecomputeGranularity recompute = RecomputeGranularity::kFull;  ///< full = uniform, 1 layer per checkpoint
  enum class Metric { iteration_seconds, tflops_per_gpu } metric = Metric::iteration_seconds;
  double published = 0;
};

/// The 8 Korthikanti rows followed by the 10 Narayanan rows.
std::vector<PublishedRow> published_rows();

struct RowCheck {
  PublishedRow row;
  Candidate published_layout;  ///< the published layout (unpublished knobs: the planner's best)
  double predicted = 0;        ///< in the row's metric
  double relative_error = 0;   ///< (predicted − published) / published
  Candidate planner_best;      ///< best layout of a full search on the same GPUs and batch
  bool published_fits = false;
};

/// Reproduces every row on `gpu` (8 GPUs per node). With `search_best`, also runs the full
/// layout search for each row's model, GPUs and batch (slower: about a second in all).
std::vector<RowCheck> check_published(const GpuSpec& gpu, bool search_best);

/// Human-readable table of the checks with mean and worst absolute error.
std::string format_checks(const std::vector<RowCheck>& checks);

}  // namespace loom::planner
