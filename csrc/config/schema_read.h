// Internal: converting a (resolved) document tree into a typed Recipe.
#pragma once

#include <set>
#include <string>

#include "config/recipe.h"
#include "config/tree.h"

namespace loom::config::detail {

/// Renames alias keys (e.g. every_n_train_steps) to their canonical names; reports a key given
/// under both names.
void apply_key_aliases(Node& root, Diagnostics& diag);

/// Reports keys the schema does not know (with the closest valid key) and sections that are not
/// mappings. `root_where` locates problems with the document itself.
void check_keys(const Node& root, const SourceLocation& root_where, Diagnostics& diag,
                RecipeKind kind = RecipeKind::kPretraining);

/// Reads every schema field of r.kind's recipe from `root` into `r`: type errors and missing required fields go to
/// `diag`; the location of every value read is stored in r.origin.locations; fields marked
/// Need::kDerived that are absent or null are added to `derived`.
void read_fields(const Node& root, const SourceLocation& root_where, Recipe& r, Diagnostics& diag,
                 std::set<std::string>& derived);

/// Why `path`, not a key of a `kind` recipe, is a key of another kind's recipe (e.g. "not a
/// key of a fine-tuning recipe: the model's shape comes from the base checkpoint ..."); "" when
/// no kind has it.
std::string other_kind_key(const std::string& path, RecipeKind kind);

/// Scalar parsers shared with overrides/interpolation: whole-string parses, false on failure.
bool parse_int(const std::string& text, int64_t& out);
bool parse_double(const std::string& text, double& out);
bool parse_bool(const std::string& text, bool& out);

}  // namespace loom::config::detail
