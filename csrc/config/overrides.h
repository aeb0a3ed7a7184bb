// Internal: command-line overrides "section.key=value" (Hydra/NeMo style, without '+'/'~').
#pragma once

#include <string>
#include <vector>

#include "config/recipe.h"
#include "config/tree.h"

namespace loom::config::detail {

/// Applies each override in order to `root`: the key must be a known field or section (or an
/// alias of one; an unknown key is reported with the closest valid key), or an item of a list
/// field by its index from 0 and keys inside it (`model.task_templates.0.prompt_template=...`:
/// the item must exist; its keys are checked when the recipe is read), the value is parsed as
/// YAML (scalar, flow sequence `[a, b]`, flow mapping, or empty for null) and replaces whatever
/// the file had there, creating sections as needed. Values keep the override text as their
/// location, so later errors name the override.
void apply_overrides(Node& root, const std::vector<std::string>& overrides, Diagnostics& diag,
                     RecipeKind kind = RecipeKind::kPretraining);

}  // namespace loom::config::detail
