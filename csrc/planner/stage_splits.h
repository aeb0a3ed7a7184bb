// Which pipeline splits the layout search tries (docs/planner.md, "Search"; the rules themselves:
// rules/layout_rules.h and docs/design/parallel_layout.md, "Uneven stages").
#pragma once
#include <optional>
#include <vector>

namespace loom::planner {

/// A split's uneven end stages: layers of the first / last pipeline stage, 0 = an even share
/// (Layout::first_stage_layers / last_stage_layers).
struct StageSplit {
  int first = 0, last = 0;
  /// As Layout holds them: null for an even share.
  std::optional<int> first_stage_layers() const { return first > 0 ? std::optional<int>(first) : std::nullopt; }
  std::optional<int> last_stage_layers() const { return last > 0 ? std::optional<int>(last) : std::nullopt; }
  bool operator==(const StageSplit& o) const { return first == o.first && last == o.last; }
};

/// The splits of `num_layers` layers over `p` stages of `v` chunks each that the search tries:
/// the even split when the rules allow it, then every legal uneven split (Megatron-Core's) whose
/// end stages are lighter: with p > 2 each end holds between n − 2v and n layers, n the middle
/// stages' share; with p = 2 the two stages differ by at most 2v. The embedding and the logits and
/// loss make the end stages slower and (stage 0) fuller, which lighter ends balance; heavier ends
/// only lengthen the critical stage. Each split is given once, with an end left unset when it
/// holds the share the rules would give it. Empty when none is legal (e.g. p > num_layers).
std::vector<StageSplit> candidate_stage_splits(int num_layers, int p, int v);

}  // namespace loom::planner
