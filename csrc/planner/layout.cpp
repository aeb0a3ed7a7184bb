#include "planner/layout.h"

#include <fmt/format.h>

namespace loom::planner {

double element_bytes(Precision p) { return p == Precision::kFp32 ? 4.0 : 2.0; }

}  // namespace loom::planner
