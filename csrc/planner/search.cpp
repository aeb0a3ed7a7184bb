#include "planner/search.h"

#include "planner/stage_splits.h"
#include "rules/layout_rules.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <utility>
#include <stdexcept>
#include <tuple>

#include <fmt/format.h>

namespace loom::planner {
namespace {

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) out.push_back(i);
  return out;
}

template <class T>
bool allowed(const std::vector<T>& list, T value) {
  return list.empty() || std::find(list.begin(), list.end(), value) != list.end();
}

// Keeps the `keep` fastest candidates: a max-heap on step time.
class TopK {
 public:
  explicit TopK(std::size_t keep) : keep_(keep) {}
  void offer(const Candidate& c) {
    if (keep_ == 0) return;
    if (heap_.size() < keep_) {
      heap_.push_back(c);
      std::push_heap(heap_.begin(), heap_.end(), slower);
    } else if (c.step_seconds() < heap_.front().step_seconds()) {
      std::pop_heap(heap_.begin(), heap_.end(), slower);
      heap_.back() = c;
      std::push_heap(heap_.begin(), heap_.end(), slower);
    }
  }
  std::vector<Candidate> sorted() {
    std::sort_heap(heap_.begin(), heap_.end(), slower);
    return std::move(heap_);
  }

 private:
  static bool slower(const Candidate& a, const Candidate& b) { return a.step_seconds() < b.step_seconds(); }
  std::size_t keep_;
  std::vector<Candidate> heap_;
};

}  // namespace

std::string check_layout(const ModelShape& m, const Cluster& c, const TrainingSetup& setup,
                         const Layout& L) {
  if (L.dp < 1) return fmt::format("d = {} must be >= 1", L.dp);
  if (long(L.tp) * L.pp * L.dp != c.world())
    return fmt::format("t·p·d = {}·{}·{} must equal the {} GPUs", L.tp, L.pp, L.dp, c.world());
  rules::LayoutQuery q;
  q.num_nodes = c.num_nodes;
  q.devices = c.gpus_per_node;
  q.layout = L;
  q.layout.global_batch = setup.global_batch;
  // As the recipe spells it: a method and a layer count only with full recomputation, where a
  // candidate without a method is uniform (the model's default) and one without a count has 0.
  const bool full = L.recompute.full();
  q.layout.recompute = {L.recompute.granularity, full ? L.recompute.method_or_uniform() : RecomputeMethod::kNone,
                        full ? std::optional<int64_t>(L.recompute.num_layers.value_or(0)) : std::nullopt};
  q.model = m;
  q.model.max_position_embeddings = m.seq_length;
  auto violations = rules::layout_violations(q);
  for (auto& v : rules::fused_attention_violations(setup.fused_attention, 0.0, L.recompute.granularity)) violations.push_back(v);
  if (!violations.empty()) return violations.front().text();
  // Legal, but the same run as another candidate: the search space leaves these out.
  if (L.sequence_parallel && L.tp == 1) return "sequence parallelism with t = 1 is the same layout without it";
  if (L.distributed_optimizer && L.dp == 1) return "the distributed optimizer with d = 1 shards nothing";
  return "";
}

Candidate evaluate(const ModelShape& m, const Cluster& c, const TrainingSetup& setup, const Layout& L) {
  Candidate out;
  out.layout = L;
  const double capacity = c.gpu.memory_gib * 1073741824.0;
  out.memory = worst_stage_memory(m, setup, L, capacity);
  out.fits = out.memory.terms.total() <= capacity;
  out.time = step_time(m, c, setup, L);
  return out;
}

Throughput throughput(const ModelShape& m, const Cluster& c, const TrainingSetup& setup,
                      const Candidate& cand, double token_budget, double price) {
  Throughput t;
  const double step = cand.step_seconds();
  t.tokens_per_second = double(setup.global_batch) * m.seq_length / step;
  t.model_tflops_per_gpu = m.model_flops_per_sample() * setup.global_batch / step / c.world() / 1e12;
  t.mfu = t.model_tflops_per_gpu / c.gpu.peak_tflops;
  if (token_budget > 0) t.days = token_budget / t.tokens_per_second / 86400.0;
  if (price > 0 && t.days > 0) t.cost = t.days * 24 * c.world() * price;
  return t;
}

SearchResult search(const ModelShape& m, const Cluster& c, const TrainingSetup& setup,
                    const SearchSpace& space, std::size_t keep) {
  m.validate();
  if (setup.global_batch <= 0)
    throw std::invalid_argument(fmt::format("--global-batch-size must be > 0, found {}", setup.global_batch));
  if (c.world() <= 0) throw std::invalid_argument("the cluster must have at least one GPU");
  const auto start = std::chrono::steady_clock::now();
  const double capacity = c.gpu.memory_gib * 1073741824.0;
  const int world = c.world();
  SearchResult result;
  TopK best(keep), unfit(keep);
  // The pipeline splits of each (p, v), found once (stage_splits.h).
  std::map<std::pair<int, int>, std::vector<StageSplit>> split_cache;
  auto splits = [&](int p, int v) -> const std::vector<StageSplit>& {
    auto it = split_cache.find({p, v});
    if (it == split_cache.end()) it = split_cache.emplace(std::make_pair(p, v), candidate_stage_splits(m.num_layers, p, v)).first;
    return it->second;
  };

  for (int t : divisors(world)) {
    if (!allowed(space.tp, t) || m.num_attention_heads % t || m.query_groups() % t || m.hidden_size % t || m.ffn() % t)
      continue;
    for (int sp : {0, 1}) {
      if (!allowed(space.sequence_parallel, sp)) continue;
      if (sp && (t == 1 || m.seq_length % t)) continue;
      for (int p : divisors(world / t)) {
        if (!allowed(space.pp, p) || p > m.num_layers) continue;
        const int d = world / (t * p);
        if (setup.global_batch % d) continue;
        for (int b : divisors(setup.global_batch / d)) {
          if (!allowed(space.micro_batch, b)) continue;
          const int micro_batches = setup.global_batch / (d * b);
          const double eb = element_bytes(setup.precision);
          const LayerCost layer = layer_cost(m, c, t, sp, b, eb, setup.fused_attention, setup.overlap_tp_comm);
          const EndCost ends = end_cost(m, c, t, sp, b, eb);
          for (int v = 1; v * p <= m.num_layers; ++v) {
            if (!allowed(space.vp, v)) continue;
            if (v > 1 && (p < 2 || micro_batches % p)) continue;
            for (const StageSplit& split : splits(p, v)) {
            if (!allowed(space.uneven_stages, int(split.first > 0 || split.last > 0))) continue;
            for (int dist : {0, 1}) {
              if (!allowed(space.distributed_optimizer, dist) || (dist && d == 1)) continue;
              Layout L;
              L.tp = t; L.pp = p; L.vp = v; L.dp = d; L.micro_batch = b; L.global_batch = setup.global_batch;
              L.sequence_parallel = sp; L.distributed_optimizer = dist;
              L.first_stage_layers = split.first_stage_layers();
              L.last_stage_layers = split.last_stage_layers();
              const int chunk = int(rules::largest_chunk_layers(L.split(m.num_layers)));
              auto consider = [&](RecomputeGranularity r, RecomputeMethod method, int layers) {
                if (!allowed(space.recompute, r)) return;
                if (r == RecomputeGranularity::kFull &&
                    (!allowed(space.method, method) || !allowed(space.recompute_layers, layers)))
                  return;
                L.recompute.granularity = r; L.recompute.method = method; L.recompute.num_layers = layers;
                // The loops above prune by the same rules for speed; the rules decide.
                if (!check_layout(m, c, setup, L).empty()) return;
                Candidate cand;
                cand.layout = L;
                cand.memory = worst_stage_memory(m, setup, L, capacity);
                cand.fits = cand.memory.terms.total() <= capacity;
                cand.time = step_time(m, c, setup, L, layer, ends);
                ++result.enumerated;
                if (cand.fits) {
                  ++result.fitting;
                  best.offer(cand);
                } else {
                  ++result.unfit_by_term[cand.memory.terms.largest_term()];
                  unfit.offer(cand);
                }
              };
              consider(RecomputeGranularity::kNone, RecomputeMethod::kUniform, 0);
              consider(RecomputeGranularity::kSelective, RecomputeMethod::kUniform, 0);
              for (int k : divisors(chunk)) consider(RecomputeGranularity::kFull, RecomputeMethod::kUniform, k);
              // Block with k = chunk recomputes every layer: the same as uniform with k = 1.
              for (int k = 1; k < chunk; ++k) consider(RecomputeGranularity::kFull, RecomputeMethod::kBlock, k);
            }
            }
          }
        }
      }
    }
  }
  result.best = best.sorted();
  result.best_unfit = unfit.sorted();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace loom::planner
