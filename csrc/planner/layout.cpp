#include "planner/layout.h"

#include <fmt/format.h>

namespace loom::planner {

double element_bytes(Precision p) { return p == Precision::kFp32 ? 4.0 : 2.0; }

std::string Layout::recompute_name() const {
  if (recompute == RecomputeGranularity::kNone) return "none";
  if (recompute != RecomputeGranularity::kFull) return recipe_name(recompute);
  return fmt::format("full-{}-{}", recipe_name(method), recompute_layers);
}

std::string Layout::describe() const {
  return fmt::format("t{} p{} v{} d{} b{}{} {}{}", tp, pp, vp, dp, micro_batch,
                     sequence_parallel ? " sp" : "", recompute_name(),
                     distributed_optimizer ? " dopt" : "");
}

}  // namespace loom::planner
