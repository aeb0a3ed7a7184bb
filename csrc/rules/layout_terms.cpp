#include "rules/layout_terms.h"

namespace loom {

const char* recipe_name(RecomputeGranularity g) {
  switch (g) {
    case RecomputeGranularity::kNone: return "null";
    case RecomputeGranularity::kSelective: return "selective";
    case RecomputeGranularity::kFull: return "full";
  }
  return "?";
}

const char* recipe_name(RecomputeMethod m) {
  switch (m) {
    case RecomputeMethod::kNone: return "null";
    case RecomputeMethod::kUniform: return "uniform";
    case RecomputeMethod::kBlock: return "block";
  }
  return "?";
}

const char* recipe_name(Precision p) {
  switch (p) {
    case Precision::kFp32: return "32";
    case Precision::kBf16: return "bf16";
    case Precision::kFp16: return "16";
  }
  return "?";
}

}  // namespace loom
