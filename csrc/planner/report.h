// Output of `loom plan`: ranked table (terminal and CSV), the winner as a ready-to-run NeMo-style
// recipe, and an explanation of why it wins and which memory term binds.
#pragma once
#include <string>
#include <vector>

#include "planner/search.h"

namespace loom::planner {

/// Everything the report needs besides the candidates.
struct PlanContext {
  ModelShape shape;
  Cluster cluster;
  TrainingSetup setup;
  double token_budget = 0;        ///< tokens to train for (0: no days column)
  double price_per_gpu_hour = 0;  ///< currency per GPU-hour (0: no cost column)
};

/// Fixed-width table of the first `rows` candidates: TP PP VP DP MBS SP recompute dopt,
/// memory per GPU (worst stage, GiB), step time and its terms (s), tokens/s, model TFLOP/s per
/// GPU, MFU, days and cost when given.
std::string format_table(const PlanContext& ctx, const std::vector<Candidate>& cands, std::size_t rows);

/// The same columns as CSV with a header line (every candidate).
std::string format_csv(const PlanContext& ctx, const std::vector<Candidate>& cands);

/// A recipe YAML with NeMo field names (trainer.num_nodes/devices/precision, model.* parallel
/// sizes, batch, shape, activations_checkpoint_*, optim.name distributed_fused_adam or
/// fused_adam) for `best`, headed by comments with the prediction.
std::string recipe_yaml(const PlanContext& ctx, const Candidate& best);

/// Why the first candidate beats the next `compare` ones (largest differing time terms and
/// knobs), and its memory: every term of the worst stage, headroom and the binding term.
std::string explain(const PlanContext& ctx, const SearchResult& result, std::size_t compare = 3);

/// How a recipe's own layout compares: its predicted step time and memory, its rank among the
/// ranked layouts (or why it is invalid / does not fit) and the gain of the best layout.
std::string describe_recipe_layout(const PlanContext& ctx, const SearchResult& result, const Layout& layout);

/// The layers of each pipeline stage in short: "even" for an even split, else e.g. "5,6x6,3"
/// (first, the middle stages' share × their count, last) or "2,3" (p = 2).
std::string stage_split_text(const ModelShape& shape, const Layout& layout);

/// Every pipeline stage's memory for `layout` (memory_model.h, every_stage_memory), one line a
/// stage: layers, micro-batches in flight (1F1B p − s, interleaved docs/design/parallel_layout.md),
/// weights+grads+optimizer, layer activations, embedding/logits, recompute working set, reserve,
/// total (GiB); the worst stage is marked. `prefix` starts every line (e.g. "# " in a recipe).
std::string format_stage_memory(const PlanContext& ctx, const Layout& layout, const std::string& prefix = "");

/// Memory breakdown of one candidate (all terms in GiB, capacity, verdict).
std::string describe_memory(const PlanContext& ctx, const Candidate& cand);

}  // namespace loom::planner
