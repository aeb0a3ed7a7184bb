// The planner's vocabulary of a training layout: the candidates are loom::Layout (rules/layout.h,
// the type the recipe check, the trainer and the converter use too), plus the bytes of an
// activation element by precision.
#pragma once
#include <string>

#include "rules/layout.h"
#include "rules/layout_rules.h"
#include "rules/layout_terms.h"

namespace loom::planner {

// The recipe's vocabulary (rules/layout_terms.h). Precision sets the bytes per parameter of
// docs/design/parallel_layout.md, "Distributed optimizer" (bf16 params + fp32 grads: 18 → 6 + 12/d;
// fp16: 20 → 4 + 16/d; fp32, as CPU ranks train: 16 → 8 + 8/d) and the bytes of an activation
// element (2, or 4 for fp32).
using loom::Precision;
using loom::RecomputeGranularity;
using loom::RecomputeMethod;

/// Bytes of one activation element: 2 for bf16/fp16, 4 for fp32.
double element_bytes(Precision p);

/// The one layout type (rules/layout.h): the planner's candidates are loom::Layout.
using loom::Layout;
using loom::RecomputeSettings;

}  // namespace loom::planner
