// The model's pipeline split as the layout rules take it (docs/design/parallel_layout.md,
// "Uneven stages"): a small header of its own so that only its callers rebuild.
#pragma once
#include "model/gpt_config.h"
#include "rules/layout_rules.h"

namespace loom::model {

/// The split of config.num_layers over p pipeline ranks × v virtual stages, with the uneven
/// first / last stage of config.layout (Layout::split at pp = p, vp = v). Not checked:
/// rules::pipeline_violations does that.
rules::PipelineSplit pipeline_split(const GptConfig& config, int64_t p, int64_t v);

}  // namespace loom::model
