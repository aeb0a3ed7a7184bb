#include "runtime/parallel_layout.h"

#include <algorithm>
#include <stdexcept>

namespace loom::runtime {

ParallelLayout::ParallelLayout(int world_size, int tensor_parallel, int pipeline_parallel)
    : world_(world_size) {
  auto positive = [](int v, const char* name) {
    if (v < 1) {
      throw std::invalid_argument(std::string(name) + " must be >= 1, got " + std::to_string(v));
    }
  };
  positive(world_size, "world size");
  positive(tensor_parallel, "tensor_model_parallel_size");
  positive(pipeline_parallel, "pipeline_model_parallel_size");
  if (world_size % (tensor_parallel * pipeline_parallel) != 0) {
    throw std::invalid_argument(
        "world size " + std::to_string(world_size) +
        " is not divisible by tensor_model_parallel_size × pipeline_model_parallel_size = " +
        std::to_string(tensor_parallel) + " × " + std::to_string(pipeline_parallel));
  }
  sizes_.tp = tensor_parallel;
  sizes_.pp = pipeline_parallel;
  sizes_.dp = world_size / (tensor_parallel * pipeline_parallel);
}

RankCoords ParallelLayout::coords(int rank) const {
  if (rank < 0 || rank >= world_) {
    throw std::out_of_range("rank " + std::to_string(rank) + " outside world of " +
                            std::to_string(world_));
  }
  return {rank % sizes_.tp, (rank / sizes_.tp) % sizes_.dp, rank / (sizes_.tp * sizes_.dp)};
}

int ParallelLayout::rank_of(const RankCoords& c) const { return c.tp + sizes_.tp * (c.dp + sizes_.dp * c.pp); }

std::vector<int> ParallelLayout::tensor_group(int rank) const {
  RankCoords c = coords(rank);
  std::vector<int> g;
  for (int i = 0; i < sizes_.tp; ++i) g.push_back(rank_of({i, c.dp, c.pp}));
  return g;
}

std::vector<int> ParallelLayout::data_group(int rank) const {
  RankCoords c = coords(rank);
  std::vector<int> g;
  for (int i = 0; i < sizes_.dp; ++i) g.push_back(rank_of({c.tp, i, c.pp}));
  return g;
}

std::vector<int> ParallelLayout::pipeline_group(int rank) const {
  RankCoords c = coords(rank);
  std::vector<int> g;
  for (int i = 0; i < sizes_.pp; ++i) g.push_back(rank_of({c.tp, c.dp, i}));
  return g;
}

std::vector<int> ParallelLayout::model_parallel_group(int rank) const {
  RankCoords c = coords(rank);
  std::vector<int> g;
  for (int pp = 0; pp < sizes_.pp; ++pp) {
    for (int tp = 0; tp < sizes_.tp; ++tp) g.push_back(rank_of({tp, c.dp, pp}));
  }
  std::sort(g.begin(), g.end());
  return g;
}

std::vector<int> ParallelLayout::embedding_group(int rank) const {
  auto pipe = pipeline_group(rank);
  if (pipe.size() == 1) return pipe;
  return {pipe.front(), pipe.back()};
}

namespace {
template <typename F>
std::vector<std::vector<int>> distinct_groups(int world, F group_of) {
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < world; ++r) {
    auto g = group_of(r);
    if (std::find(groups.begin(), groups.end(), g) == groups.end()) groups.push_back(g);
  }
  return groups;
}
}  // namespace

std::vector<std::vector<int>> ParallelLayout::all_tensor_groups() const {
  return distinct_groups(world_, [&](int r) { return tensor_group(r); });
}
std::vector<std::vector<int>> ParallelLayout::all_data_groups() const {
  return distinct_groups(world_, [&](int r) { return data_group(r); });
}
std::vector<std::vector<int>> ParallelLayout::all_pipeline_groups() const {
  return distinct_groups(world_, [&](int r) { return pipeline_group(r); });
}
std::vector<std::vector<int>> ParallelLayout::all_model_parallel_groups() const {
  return distinct_groups(world_, [&](int r) { return model_parallel_group(r); });
}
std::vector<std::vector<int>> ParallelLayout::all_embedding_groups() const {
  // Middle pipeline stages belong to no embedding group; list only first/last-stage groups.
  std::vector<std::vector<int>> groups;
  for (const auto& pipe : all_pipeline_groups()) {
    groups.push_back(pipe.size() == 1 ? pipe : std::vector<int>{pipe.front(), pipe.back()});
  }
  return groups;
}

std::string ParallelLayout::describe() const {
  return "world " + std::to_string(world_) + " = tensor " + std::to_string(sizes_.tp) + " × data " +
         std::to_string(sizes_.dp) + " × pipeline " + std::to_string(sizes_.pp);
}

}  // namespace loom::runtime
