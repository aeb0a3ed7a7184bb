// Rank layout of Megatron's default order "tp-dp-pp" (tensor rank varies fastest):
//   global_rank = tp_rank + t·(dp_rank + d·pp_rank),  world = t·d·p
// and the process groups built from it (docs/design/parallel_layout.md, "Ranks and groups").
// Pure arithmetic, no torch, no communication.
#pragma once
#include <string>
#include <vector>

#include "rules/layout.h"

namespace loom::runtime {

/// One rank's coordinates in the layout.
struct RankCoords {
  int tp = 0;  ///< tensor-parallel rank
  int dp = 0;  ///< data-parallel rank
  int pp = 0;  ///< pipeline stage
};

/// The rank map of a loom::Layout's t, p and d over a world of t·p·d ranks.
class ParallelLayout {
 public:
  /// Throws std::invalid_argument naming the size when world, t or p is < 1 or
  /// world % (t·p) != 0.
  ParallelLayout(int world_size, int tensor_parallel, int pipeline_parallel);

  int world_size() const { return world_; }
  int tensor_parallel() const { return sizes_.tp; }
  int pipeline_parallel() const { return sizes_.pp; }
  int data_parallel() const { return sizes_.dp; }
  /// The layout's sizes: tp, pp and dp set, every other field at its default.
  const Layout& sizes() const { return sizes_; }

  RankCoords coords(int rank) const;
  int rank_of(const RankCoords& c) const;

  /// Sorted member ranks of `rank`'s group. Tensor: same dp, pp. Data: same tp, pp.
  /// Pipeline: same tp, dp. Model-parallel: same dp (all tp × pp). Embedding: the first and
  /// last rank of `rank`'s pipeline group (one rank when p = 1).
  std::vector<int> tensor_group(int rank) const;
  std::vector<int> data_group(int rank) const;
  std::vector<int> pipeline_group(int rank) const;
  std::vector<int> model_parallel_group(int rank) const;
  std::vector<int> embedding_group(int rank) const;

  /// Every group of one kind, in order of their lowest rank (each rank in exactly one).
  std::vector<std::vector<int>> all_tensor_groups() const;
  std::vector<std::vector<int>> all_data_groups() const;
  std::vector<std::vector<int>> all_pipeline_groups() const;
  std::vector<std::vector<int>> all_model_parallel_groups() const;
  std::vector<std::vector<int>> all_embedding_groups() const;

  std::string describe() const;  ///< "world 16 = tensor 2 × data 4 × pipeline 2"

 private:
  int world_;
  Layout sizes_;
};

}  // namespace loom::runtime
