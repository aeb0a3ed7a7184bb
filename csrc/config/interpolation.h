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

#include "config/tree.h"

namespace loom::config::detail {

/// Resolves every interpolation in the tree in place; failed values are marked invalid.
void resolve_interpolations(Node& root, Diagnostics& diag);

}  // namespace loom::config::detail
