#include "planner/layout.h"

#include <fmt/format.h>

namespace loom::planner {

double element_bytes(Precision p) { return p == Precision::kFp32 ? 4.0 : 2.0; }

std::string Layout::recompute_name() const {
  if (recompute == RecomputeGranularity::kNone) return "none";
  if (recompute != RecomputeGranularity::kFull) return recipe_name(recompute);
  return fmt::format("full-{}-{}", recipe_name(method), recompute_layers);
}

rules::PipelineSplit Layout::split(int num_layers) const {
  rules::PipelineSplit s;
  s.num_layers = num_layers;
  s.pipeline = pp;
  s.virtual_stages = vp;
  if (first_stage_layers > 0) s.first_stage_layers = first_stage_layers;
  if (last_stage_layers > 0) s.last_stage_layers = last_stage_layers;
  return s;
}

int Layout::stage_layers(int num_layers, int stage) const {
  return static_cast<int>(rules::stage_layers(split(num_layers), stage));
}

std::string Layout::describe() const {
  const std::string stages = (first_stage_layers > 0 ? fmt::format(" f{}", first_stage_layers) : std::string()) +
                             (last_stage_layers > 0 ? fmt::format(" l{}", last_stage_layers) : std::string());
  return fmt::format("t{} p{}{} v{} d{} b{}{} {}{}", tp, pp, stages, vp, dp, micro_batch,
                     sequence_parallel ? " sp" : "", recompute_name(),
                     distributed_optimizer ? " dopt" : "");
}

}  // namespace loom::planner
