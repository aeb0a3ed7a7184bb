// The layout flags of `loom convert` (--tensor-parallel, --pipeline-parallel,
// --virtual-pipeline, --data-parallel, --distributed-optimizer): unset fields keep the
// source's layout (an HF import's source is t = p = v = d = 1 without the distributed optimizer).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "config/recipe.h"
#include "rules/layout.h"

namespace loom::convert {

struct LayoutRequest {
  std::optional<int> tensor_parallel, pipeline_parallel, virtual_pipeline, data_parallel;
  std::optional<bool> distributed_optimizer;
  /// --first-stage-layers / --last-stage-layers: "even" or a layer count (Megatron-Core's
  /// num_layers_in_first/last_pipeline_stage; docs/design/parallel_layout.md, "Uneven stages").
  std::optional<std::string> first_stage_layers, last_stage_layers;
};

/// `request` over `source` (a loom::Layout: t, p, v, d, the distributed optimizer and the uneven
/// end stages are read and set; the batch and recompute fields are kept). An unset stage-size flag keeps the source's size when p and v stay,
/// and is even otherwise (the old size rarely fits another split). Throws ConvertInputError
/// naming the flag for a size < 1 or a stage size that is neither "even" nor an integer.
Layout resolve_layout(const LayoutRequest& request, const Layout& source);

/// Recipe overrides that set `layout` (trainer.devices/num_nodes, the model's parallel sizes,
/// sequence parallelism off at t = 1, the optimizer name) and the run directory `run_dir`.
std::vector<std::string> layout_overrides(const Layout& layout, const config::Recipe& base, const std::string& run_dir);

}  // namespace loom::convert
