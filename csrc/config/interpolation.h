// Internal: OmegaConf-style interpolation, the subset NeMo recipes use.
//   ${model.encoder_seq_length}   absolute reference (from the document root)
//   ${.hidden_size}               relative: a sibling in the same mapping; ${..x} one level up
//   ${model.optim.betas.0}        a sequence item by index
//   runs/${run.name}/log          references inside a string (each must be a scalar)
//   ${multiply:4, ${.hidden_size}}  NeMo's `multiply` resolver (product of its arguments)
//   \${literal}                   escaped, kept as the text "${literal}"
// A value that is exactly one reference takes the referenced value's type (number, sequence,
// ...); a string with references stays a string. References see keys written in the file or
// set by overrides (not schema defaults). Cycles and missing keys are reported with the
// location of the referencing value.
#pragma once

#include "config/recipe.h"
#include "config/tree.h"

namespace loom::config::detail {

/// Limits that keep a hostile recipe from exhausting the stack or memory (docs/design/
/// hardening.md); each is reported once, at the value whose resolution reached it:
/// a chain of references (a -> b -> c ...) of at most kMaxInterpolationChain links, "${" nested
/// at most kMaxInterpolationNesting deep, an interpolated string of at most
/// kMaxInterpolatedBytes, and kInterpolationBudget text bytes and copied values in all.
inline constexpr size_t kMaxInterpolationChain = 64;
inline constexpr int kMaxInterpolationNesting = 128;
inline constexpr size_t kMaxInterpolatedBytes = size_t{1} << 20;
inline constexpr size_t kInterpolationBudget = size_t{64} << 20;

/// Resolves every interpolation in the tree in place; failed values are marked invalid. `kind`
/// names the recipe whose keys the error hints suggest.
void resolve_interpolations(Node& root, Diagnostics& diag, RecipeKind kind = RecipeKind::kPretraining);

}  // namespace loom::config::detail
