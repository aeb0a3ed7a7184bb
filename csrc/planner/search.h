// Layout search: enumerate every layout that divides (TP, PP, virtual stages, pipeline split —
// even or with lighter uneven end stages, stage_splits.h —, DP, micro-batch, SP, recompute
// granularity/method/layers, distributed optimizer), keep those that fit in memory
// and rank them by predicted step time. Only divisibility and memory prune; knobs can be fixed
// or restricted to lists.
#pragma once
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "planner/hardware.h"
#include "planner/layout.h"
#include "planner/memory_model.h"
#include "planner/model_shape.h"
#include "planner/time_model.h"
#include "planner/training_setup.h"

namespace loom::planner {

/// Restrictions of the search; an empty list means "every valid value".
struct SearchSpace {
  std::vector<int> tp, pp, vp, micro_batch;
  std::vector<int> sequence_parallel;  ///< 0 / 1
  std::vector<RecomputeGranularity> recompute;
  std::vector<RecomputeMethod> method;
  std::vector<int> recompute_layers;
  std::vector<int> distributed_optimizer;  ///< 0 / 1
  std::vector<int> uneven_stages;          ///< 0 / 1: even / uneven pipeline splits (stage_splits.h)
};

/// Why a layout cannot be a candidate, or "" when it can: d must equal world/(t·p), then the
/// first violation of the layout rules (rules/layout_rules.h, the recipe check's messages, e.g.
/// "model.num_layers: expected a multiple of …"), then two legal layouts the search leaves out as
/// duplicates (sequence parallelism at t = 1, the distributed optimizer at d = 1). The position
/// table is taken as long as the sequence.
std::string check_layout(const ModelShape& m, const Cluster& c, const TrainingSetup& setup,
                         const Layout& layout);

/// One evaluated layout.
struct Candidate {
  Layout layout;
  WorstStage memory;
  TimeBreakdown time;
  bool fits = false;
  double step_seconds() const { return time.total(); }
};

/// Derived throughput figures of a candidate.
struct Throughput {
  double tokens_per_second = 0;
  double model_tflops_per_gpu = 0;  ///< model FLOPs (no recompute) / step / GPUs
  double mfu = 0;                   ///< model_tflops_per_gpu / peak
  double days = 0;                  ///< for the token budget (0 when none)
  double cost = 0;                  ///< days · 24 · GPUs · price (0 when no price)
};
Throughput throughput(const ModelShape& m, const Cluster& c, const TrainingSetup& setup,
                      const Candidate& cand, double token_budget, double price_per_gpu_hour);

/// Evaluates one layout (memory and time) without checking validity.
Candidate evaluate(const ModelShape& m, const Cluster& c, const TrainingSetup& setup, const Layout& layout);

struct SearchResult {
  std::vector<Candidate> best;        ///< fitting layouts, fastest first (at most `keep`)
  std::vector<Candidate> best_unfit;  ///< fastest layouts that do not fit (at most `keep`)
  std::size_t enumerated = 0;         ///< valid layouts evaluated
  std::size_t fitting = 0;
  std::map<std::string, std::size_t> unfit_by_term;  ///< binding term → count
  double seconds = 0;                 ///< wall time of the search
};

/// Runs the search. Throws std::invalid_argument if the model shape or setup is invalid
/// (global batch ≤ 0, world ≤ 0).
SearchResult search(const ModelShape& m, const Cluster& c, const TrainingSetup& setup,
                    const SearchSpace& space, std::size_t keep = 100);

}  // namespace loom::planner
