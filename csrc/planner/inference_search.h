// Inference layout search: enumerate every valid (tensor size, pipeline size, batch), evaluate
// memory and time with inference_model.h, keep the layouts that fit and meet the latency /
// throughput limits, and rank them.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "planner/inference_model.h"

namespace loom::planner {

/// Knob restrictions (empty: every valid t dividing heads, ffn and world; every p dividing the
/// layers with t·p | world; batch 1, 2, 4, …, 1024) and the service limits (0: no limit).
struct InferenceSearchSpace {
  std::vector<int> tp, pp, batch;
  double max_latency_ms = 0;        ///< whole request: TTFT + (output − 1) · per-token
  double max_token_latency_ms = 0;  ///< interval between generated tokens
  double min_throughput = 0;        ///< generated tokens/s of the whole cluster
};

/// One evaluated layout.
struct InferenceCandidate {
  InferenceLayout layout;
  InferenceWorstStage memory;
  InferenceTime time;
  bool fits = false;         ///< worst-stage memory ≤ GPU memory
  bool meets_limits = false; ///< every given latency / throughput limit holds
};

/// How the ranking orders layouts that fit and meet the limits.
enum class InferenceObjective {
  tokens_per_gpu,   ///< tokens/s per GPU, descending (a latency limit given, or no limit)
  request_latency,  ///< request latency, ascending (only a throughput floor given)
};
/// The objective the limits imply (see InferenceObjective).
InferenceObjective objective_for(const InferenceSearchSpace& space);

struct InferenceSearchResult {
  std::vector<InferenceCandidate> ranked;  ///< fit and meet the limits, best first
  std::vector<InferenceCandidate> fitting; ///< every layout that fits (any limits), unranked order
  std::vector<InferenceCandidate> unfit;   ///< layouts over memory, smallest memory first
  std::size_t enumerated = 0;
  InferenceObjective objective = InferenceObjective::tokens_per_gpu;
};

/// Evaluates one valid layout against the GPU memory and the limits.
InferenceCandidate evaluate_inference(const ModelShape& m, const Cluster& c, const InferenceWorkload& w,
                                      const InferenceLayout& layout, const InferenceSearchSpace& space);

/// Runs the search. Throws std::invalid_argument for a bad workload (prompt or output tokens
/// < 1, context beyond the model's positions), an empty cluster, a listed knob that no layout
/// can use (naming the flag and value), or negative limits.
InferenceSearchResult search_inference(const ModelShape& m, const Cluster& c, const InferenceWorkload& w,
                                       const InferenceSearchSpace& space);

/// When `ranked` is empty: which requirement binds, with the best value any fitting layout
/// achieves for each violated limit (or, when nothing fits, the smallest memory need and its
/// binding term). Empty when there are ranked layouts.
std::string explain_no_layout(const InferenceSearchResult& result, const InferenceSearchSpace& space,
                              const Cluster& c);

}  // namespace loom::planner
