// The planner checked against published measurements (docs/design/planner_sources.md, "Published
// results"; docs/planner.md, "Validation"), in two kinds of group:
// - fitted: Korthikanti et al. 2022 iteration times (full recompute and SP + selective, 4 models)
//   and Narayanan et al. 2021 Table 1 TFLOP/s per GPU (full recompute, 10 models), A100-80GB,
//   s = 2048, V = 51200: the rows the A100 efficiencies were chosen on;
// - held out (never used to choose a constant): the Megatron-LM README's H100 weak-scaling table
//   (Megatron-Core r0.8.0, 9 models, s = 4096, V = 131072, model TFLOP/s per GPU) and the
//   NeMo-Megatron-Launcher README's 5B scaling table of its 2022-07 revision (A100-80GB, 1-20
//   nodes, tokens per second);
// - held out, Llama: torchtitan's published Llama 3 / 3.1 8B and 70B FSDP throughput (A100-80GB
//   and H100, s = 8192, tokens per second per GPU).
#pragma once
#include <string>
#include <vector>

#include "planner/hardware.h"
#include "planner/search.h"

namespace loom::planner {

/// A layout with vp and micro_batch 0 (not published) and full recompute: PublishedRow's default.
Layout unpublished_layout();

struct PublishedRow {
  std::string group;   ///< "fitted", "held-out H100", "held-out 5B" or "held-out Llama"
  std::string source;  ///< "Korthikanti 2022", "Narayanan 2021", "Megatron-LM README", "NeMo launcher README"
  std::string label;   ///< e.g. "175B full recompute"
  std::string gpu = "A100-80GB";  ///< built-in GPU entry (data/gpus.json)
  ModelShape shape;
  int gpus = 0;
  /// The published layout: t, p, sequence parallelism, the recompute granularity (full means
  /// uniform with 1 layer per checkpoint), the distributed optimizer; vp and micro_batch 0 = not
  /// published, the planner chooses; d follows from `gpus` (the batch is setup.global_batch).
  Layout layout = unpublished_layout();
  /// The batch and the software the run used: fused attention, overlapped TP and DP communication.
  TrainingSetup setup;
  enum class Metric {
    iteration_seconds,       ///< seconds per step
    tflops_per_gpu,          ///< hardware TFLOP/s counting full recompute (Narayanan's 96·B·L·s·h² count)
    model_tflops_per_gpu,    ///< model TFLOP/s per GPU (ModelShape::model_flops_per_sample; Megatron's count)
    tokens_per_second,       ///< global_batch · s / step
    tokens_per_second_per_gpu,  ///< global_batch · s / step / GPUs (torchtitan's TPS/GPU)
  } metric = Metric::iteration_seconds;
  double published = 0;
};

/// The 18 fitted rows (8 Korthikanti, then 10 Narayanan), then the 9 H100 rows, the 7 5B rows
/// and the 4 Llama rows.
std::vector<PublishedRow> published_rows();

/// What each held-out source leaves unpublished and what the rows assume instead, one line per
/// source (printed under the table and in docs/planner.md).
std::vector<std::string> published_assumptions();

struct RowCheck {
  PublishedRow row;
  Candidate published_layout;  ///< the published layout (unpublished knobs: the planner's best)
  double predicted = 0;        ///< in the row's metric
  double relative_error = 0;   ///< (predicted − published) / published
  Candidate planner_best;      ///< best layout of a full search on the same GPUs and batch
  bool published_fits = false;
  double capacity_gib = 0;  ///< the row's GPU memory
  /// The published layout's worst stage, reserve included (GiB), and what its GPU has left.
  double memory_gib() const { return published_layout.memory.terms.total() / 1073741824.0; }
  double headroom_gib() const { return capacity_gib - memory_gib(); }
};

/// Reproduces every row on its GPU (8 GPUs per node): the built-in entry named by the row, or
/// the entry of that name in `gpus` (a --gpu-table entry or a --profile-applied GPU), which wins.
/// With `search_best`, also runs the full layout search for each row's model, GPUs and batch.
std::vector<RowCheck> check_published(bool search_best, const std::vector<GpuSpec>& gpus = {});
/// The same with one GPU entry that replaces the rows' entry of its name.
inline std::vector<RowCheck> check_published(const GpuSpec& gpu, bool search_best) {
  return check_published(search_best, std::vector<GpuSpec>{gpu});
}

/// Mean and worst |relative error| of the rows of one group.
struct GroupError {
  std::string group;
  int rows = 0;
  double mean = 0, worst = 0;
};
std::vector<GroupError> group_errors(const std::vector<RowCheck>& checks);

/// Which term of the time model carries a group's error, as far as end-to-end figures allow:
/// for each term, the one scale factor k applied to that term in every row of the group that
/// minimises the group's mean |error|. The term whose best k lowers the mean most is the one
/// whose modelled cost is most consistent with being off (a term that does not vary between
/// rows cannot be told apart from another with the same shares).
struct TermAttribution {
  std::string term;         ///< "gemm", "attention", "memory_bound", "tp_comm", "pp_comm", "bubble", "dp_comm", ...
  double scale = 1;         ///< best k
  double mean_after = 0;    ///< the group's mean |error| with that term scaled by k
};
std::vector<TermAttribution> attribute_error(const std::vector<RowCheck>& group_checks);

/// Human-readable tables, one per group (each row with its published layout's worst-stage memory
/// and headroom on its GPU), with each group's mean and worst error, every off row's
/// time shares, the term attribution of groups over 2% mean error and the held-out assumptions.
std::string format_checks(const std::vector<RowCheck>& checks);

}  // namespace loom::planner
