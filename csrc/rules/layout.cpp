#include "rules/layout.h"

#include <fmt/format.h>

#include "rules/layout_rules.h"

namespace loom {

std::string Layout::recompute_name() const {
  if (recompute.granularity == RecomputeGranularity::kNone) return "none";
  if (!recompute.full()) return recipe_name(recompute.granularity);
  return fmt::format("full-{}-{}", recipe_name(recompute.method), recompute.num_layers.value_or(0));
}

rules::PipelineSplit Layout::split(int64_t num_layers) const {
  return {num_layers, pp, vp, first_stage_layers, last_stage_layers};
}

int Layout::stage_layers(int64_t num_layers, int stage) const {
  return static_cast<int>(rules::stage_layers(split(num_layers), stage));
}

std::string Layout::describe() const {
  const std::string stages = (first_stage_layers ? fmt::format(" f{}", *first_stage_layers) : std::string()) +
                             (last_stage_layers ? fmt::format(" l{}", *last_stage_layers) : std::string());
  return fmt::format("t{} p{}{} v{} d{} b{}{} {}{}", tp, pp, stages, vp, dp, micro_batch,
                     sequence_parallel ? " sp" : "", recompute_name(),
                     distributed_optimizer ? " dopt" : "");
}

}  // namespace loom
