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
// docs/design/parallel_layout.md, "Distributed optimizer", Loom's columns (one fp32 gradient
// buffer: bf16 and fp16 18 → 6 + 12/d; fp32, as CPU ranks train: 16 → 8 + 12/d;
// bytes_per_param in memory_model.h) and the bytes of an activation element (2, or 4 for fp32).
using loom::Precision;
using loom::RecomputeGranularity;
using loom::RecomputeMethod;

/// Bytes of one activation element: 2 for bf16/fp16, 4 for fp32.
double element_bytes(Precision p);

/// The one layout type (rules/layout.h): the planner's candidates are loom::Layout.
using loom::Layout;
using loom::RecomputeSettings;

}  // namespace loom::planner
