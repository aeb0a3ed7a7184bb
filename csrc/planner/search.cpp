#include "planner/search.h"

#include <algorithm>
#include <chrono>
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
  const int world = c.world();
  if (L.tp < 1 || L.pp < 1 || L.vp < 1 || L.dp < 1 || L.micro_batch < 1)
    return "all sizes must be >= 1";
  if (long(L.tp) * L.pp * L.dp != world)
    return fmt::format("t·p·d = {}·{}·{} must equal the {} GPUs", L.tp, L.pp, L.dp, world);
  if (m.num_attention_heads % L.tp) return fmt::format("heads {} % t {} != 0", m.num_attention_heads, L.tp);
  if (m.hidden_size % L.tp) return fmt::format("hidden {} % t {} != 0", m.hidden_size, L.tp);
  if (m.ffn() % L.tp) return fmt::format("ffn {} % t {} != 0", m.ffn(), L.tp);
  if (L.sequence_parallel && L.tp == 1) return "sequence parallelism needs t > 1";
  if (L.sequence_parallel && m.seq_length % L.tp)
    return fmt::format("sequence parallelism needs s {} % t {} == 0", m.seq_length, L.tp);
  if (m.num_layers % (L.pp * L.vp))
    return fmt::format("layers {} % (p·v = {}·{}) != 0", m.num_layers, L.pp, L.vp);
  if (setup.global_batch % (L.dp * L.micro_batch))
    return fmt::format("global batch {} % (d·b = {}·{}) != 0", setup.global_batch, L.dp, L.micro_batch);
  const int micro_batches = setup.global_batch / (L.dp * L.micro_batch);
  if (L.vp > 1 && L.pp < 2) return "virtual stages need p >= 2";
  if (L.vp > 1 && micro_batches % L.pp)
    return fmt::format("interleaving needs micro-batches {} % p {} == 0", micro_batches, L.pp);
  const int chunk = m.num_layers / (L.pp * L.vp);
  if (L.recompute == Recompute::full) {
    if (L.recompute_layers < 1) return "full recompute needs activations_checkpoint_num_layers >= 1";
    if (L.method == RecomputeMethod::uniform && chunk % L.recompute_layers)
      return fmt::format("uniform recompute layers {} must divide the {} layers of a model chunk",
                         L.recompute_layers, chunk);
    if (L.method == RecomputeMethod::block && L.recompute_layers > chunk)
      return fmt::format("block recompute layers {} exceed the {} layers of a model chunk",
                         L.recompute_layers, chunk);
  }
  if (L.distributed_optimizer && L.dp == 1) return "the distributed optimizer needs d > 1";
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

  for (int t : divisors(world)) {
    if (!allowed(space.tp, t) || m.num_attention_heads % t || m.hidden_size % t || m.ffn() % t) continue;
    for (int sp : {0, 1}) {
      if (!allowed(space.sequence_parallel, sp)) continue;
      if (sp && (t == 1 || m.seq_length % t)) continue;
      for (int p : divisors(world / t)) {
        if (!allowed(space.pp, p) || m.num_layers % p) continue;
        const int d = world / (t * p);
        if (setup.global_batch % d) continue;
        for (int b : divisors(setup.global_batch / d)) {
          if (!allowed(space.micro_batch, b)) continue;
          const int micro_batches = setup.global_batch / (d * b);
          const double eb = element_bytes(setup.precision);
          const LayerCost layer = layer_cost(m, c, t, sp, b, eb);
          const EndCost ends = end_cost(m, c, t, sp, b, eb);
          for (int v : divisors(m.num_layers / p)) {
            if (!allowed(space.vp, v)) continue;
            if (v > 1 && (p < 2 || micro_batches % p)) continue;
            const int chunk = m.num_layers / (p * v);
            for (int dist : {0, 1}) {
              if (!allowed(space.distributed_optimizer, dist) || (dist && d == 1)) continue;
              Layout L;
              L.tp = t; L.pp = p; L.vp = v; L.dp = d; L.micro_batch = b;
              L.sequence_parallel = sp; L.distributed_optimizer = dist;
              auto consider = [&](Recompute r, RecomputeMethod method, int layers) {
                if (!allowed(space.recompute, r)) return;
                if (r == Recompute::full &&
                    (!allowed(space.method, method) || !allowed(space.recompute_layers, layers)))
                  return;
                L.recompute = r; L.method = method; L.recompute_layers = layers;
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
              consider(Recompute::none, RecomputeMethod::uniform, 0);
              consider(Recompute::selective, RecomputeMethod::uniform, 0);
              for (int k : divisors(chunk)) consider(Recompute::full, RecomputeMethod::uniform, k);
              // Block with k = chunk recomputes every layer: the same as uniform with k = 1.
              for (int k = 1; k < chunk; ++k) consider(Recompute::full, RecomputeMethod::block, k);
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
