#include "planner/stage_splits.h"

#include <algorithm>
#include <cstdlib>

#include "rules/layout_rules.h"

namespace loom::planner {
namespace {

bool legal(int num_layers, int p, int v, const StageSplit& s) {
  rules::PipelineSplit split;
  split.num_layers = num_layers;
  split.pipeline = p;
  split.virtual_stages = v;
  if (s.first > 0) split.first_stage_layers = s.first;
  if (s.last > 0) split.last_stage_layers = s.last;
  return rules::pipeline_violations(split).empty();
}

}  // namespace

std::vector<StageSplit> candidate_stage_splits(int L, int p, int v) {
  std::vector<StageSplit> out;
  if (p < 1 || v < 1) return out;
  if (legal(L, p, v, {})) out.push_back({});
  if (p == 1) return out;
  auto add = [&](StageSplit s) {
    if (std::find(out.begin(), out.end(), s) == out.end() && legal(L, p, v, s)) out.push_back(s);
  };
  if (p == 2) {
    // Two stages: the first one's size says it all (the last takes the rest).
    for (int first = v; first < L; first += v)
      if (first * 2 != L && std::abs(first - (L - first)) <= 2 * v) add({first, 0});
    return out;
  }
  // p > 2: middle share n; each end n − 2v … n, left unset when it equals n.
  for (int n = v; n * (p - 2) < L; n += v) {
    for (int first = std::max(v, n - 2 * v); first <= n; first += v) {
      const int last = L - (p - 2) * n - first;
      if (last < std::max(v, n - 2 * v) || last > n) continue;
      if (first == n && last == n) continue;  // the even split
      add({first == n ? 0 : first, last == n ? 0 : last});
    }
  }
  return out;
}

}  // namespace loom::planner
