// The recipe schema's own account of its fields: every field of a recipe kind with whether it
// is required, defaulted or derived, its default as YAML and the names an enum field accepts.
// `loom recipe-fields` prints it as JSON; tools/recipe_fields_table.py writes the field table of
// recipes/README.md from it, so that each default is stated once, in recipe.h's initialisers.
#pragma once

#include <string>
#include <vector>

#include "config/recipe.h"

namespace loom::config {

struct RecipeField {
  std::string path;   ///< dotted key, e.g. "model.optim.sched.warmup_steps"
  /// "required" (must be set), "default" (absent: `default_yaml`) or "derived" (absent or
  /// null: computed from other fields, recipes/README.md states the rule).
  std::string need;
  /// The default in YAML flow style ("megatron_gpt", "null", "[0.9, 0.98]", "[]", "1.0e-08");
  /// empty unless need is "default".
  std::string default_yaml;
  /// Enum fields (and lists of an enum): the accepted names, each entry one value's spellings
  /// with the canonical (dumped) name first; null is not listed. Empty for other types.
  std::vector<std::vector<std::string>> choices;
};

/// The fields of a recipe of `kind` in dump order (schema.h's visit_recipe). The requirement of
/// a field can depend on another field's default (model.tokenizer.vocab_file is required by the
/// default library, megatron, when pretraining).
std::vector<RecipeField> recipe_fields(RecipeKind kind);

/// Both kinds' fields as one JSON object (`loom recipe-fields`):
///   {"pretraining": [field...], "prompt_learning": [field...]} with each field
///   {"field": path, "need": ..., "default": default_yaml or null, "choices": [[names...]...]}.
std::string recipe_fields_json();

}  // namespace loom::config
