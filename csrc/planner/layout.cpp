#include "planner/layout.h"

#include <fmt/format.h>

namespace loom::planner {

const char* to_string(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
  }
  return "?";
}

const char* to_string(RecomputeMethod m) { return m == RecomputeMethod::uniform ? "uniform" : "block"; }

const char* to_string(Precision p) {
  switch (p) {
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "16";
    case Precision::fp32: return "32";
  }
  return "?";
}

double element_bytes(Precision p) { return p == Precision::fp32 ? 4.0 : 2.0; }

std::string Layout::recompute_name() const {
  if (recompute != Recompute::full) return to_string(recompute);
  return fmt::format("full-{}-{}", to_string(method), recompute_layers);
}

std::string Layout::describe() const {
  return fmt::format("t{} p{} v{} d{} b{}{} {}{}", tp, pp, vp, dp, micro_batch,
                     sequence_parallel ? " sp" : "", recompute_name(),
                     distributed_optimizer ? " dopt" : "");
}

}  // namespace loom::planner
