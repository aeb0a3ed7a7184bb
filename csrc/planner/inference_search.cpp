#include "planner/inference_search.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

namespace loom::planner {
namespace {

constexpr double kGiB = double(1ull << 30);

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

void check_positive(const std::vector<int>& values, const char* flag) {
  for (int v : values)
    if (v < 1) throw std::invalid_argument(fmt::format("{}: values must be >= 1, found {}", flag, v));
}

}  // namespace

InferenceObjective objective_for(const InferenceSearchSpace& s) {
  const bool latency = s.max_latency_ms > 0 || s.max_token_latency_ms > 0;
  return !latency && s.min_throughput > 0 ? InferenceObjective::request_latency
                                          : InferenceObjective::tokens_per_gpu;
}

InferenceCandidate evaluate_inference(const ModelShape& m, const Cluster& c, const InferenceWorkload& w,
                                      const InferenceLayout& layout, const InferenceSearchSpace& s) {
  InferenceCandidate out;
  out.layout = layout;
  out.memory = inference_worst_memory(m, w, layout);
  out.time = inference_time(m, c, w, layout);
  out.fits = out.memory.terms.total() <= c.gpu.memory_gib * kGiB;
  out.meets_limits = (s.max_latency_ms <= 0 || out.time.request * 1e3 <= s.max_latency_ms) &&
                     (s.max_token_latency_ms <= 0 || out.time.per_token * 1e3 <= s.max_token_latency_ms) &&
                     (s.min_throughput <= 0 || out.time.tokens_per_s_cluster >= s.min_throughput);
  return out;
}

InferenceSearchResult search_inference(const ModelShape& m, const Cluster& c, const InferenceWorkload& w,
                                       const InferenceSearchSpace& s) {
  m.validate();
  if (c.world() < 1) throw std::invalid_argument("the cluster has no GPUs (--nodes and --gpus-per-node must be >= 1)");
  if (w.prompt_tokens < 1) throw std::invalid_argument(fmt::format("--prompt-tokens must be >= 1, found {}", w.prompt_tokens));
  if (w.output_tokens < 1) throw std::invalid_argument(fmt::format("--output-tokens must be >= 1, found {}", w.output_tokens));
  if (long(w.prompt_tokens) + w.output_tokens > m.seq_length)
    throw std::invalid_argument(fmt::format(
        "prompt + output tokens = {} exceed the model's {} learned positions (--seq-length)",
        long(w.prompt_tokens) + w.output_tokens, m.seq_length));
  if (w.reserve_gib < 0) throw std::invalid_argument("--reserve-gib must be >= 0");
  if (s.max_latency_ms < 0 || s.max_token_latency_ms < 0 || s.min_throughput < 0)
    throw std::invalid_argument("--max-latency-ms, --max-token-latency-ms and --min-throughput must be > 0");
  check_positive(s.tp, "--tp");
  check_positive(s.pp, "--pp");
  check_positive(s.batch, "--batch");

  const std::vector<int> tps = s.tp.empty() ? divisors(c.world()) : s.tp;
  const std::vector<int> pps = s.pp.empty() ? divisors(m.num_layers) : s.pp;
  std::vector<int> batches = s.batch;
  if (batches.empty())
    for (int b = 1; b <= 1024; b *= 2) batches.push_back(b);

  InferenceSearchResult result;
  result.objective = objective_for(s);
  std::string first_reason;
  for (int t : tps) {
    for (int p : pps) {
      InferenceLayout L;
      L.parallel.tp = t;
      L.parallel.pp = p;
      L.replicas = c.world() % (t * p) == 0 ? c.world() / (t * p) : 0;
      const std::string why = check_inference_layout(m, c, L);
      if (!why.empty()) {
        if (first_reason.empty()) first_reason = why;
        continue;
      }
      for (int b : batches) {
        L.batch = b;
        InferenceCandidate cand = evaluate_inference(m, c, w, L, s);
        ++result.enumerated;
        if (!cand.fits) {
          result.unfit.push_back(cand);
          continue;
        }
        if (cand.meets_limits) result.ranked.push_back(cand);
        result.fitting.push_back(std::move(cand));
      }
    }
  }
  if (result.enumerated == 0)
    throw std::invalid_argument(fmt::format("no valid layout for the given --tp/--pp lists on {} GPUs: {}",
                                            c.world(), first_reason));

  if (result.objective == InferenceObjective::request_latency) {
    std::stable_sort(result.ranked.begin(), result.ranked.end(), [](const auto& a, const auto& b) {
      return a.time.request < b.time.request;
    });
  } else {
    std::stable_sort(result.ranked.begin(), result.ranked.end(), [](const auto& a, const auto& b) {
      if (a.time.tokens_per_s_per_gpu != b.time.tokens_per_s_per_gpu)
        return a.time.tokens_per_s_per_gpu > b.time.tokens_per_s_per_gpu;
      return a.time.request < b.time.request;
    });
  }
  std::stable_sort(result.unfit.begin(), result.unfit.end(), [](const auto& a, const auto& b) {
    return a.memory.terms.total() < b.memory.terms.total();
  });
  return result;
}

std::string explain_no_layout(const InferenceSearchResult& r, const InferenceSearchSpace& s, const Cluster& c) {
  if (!r.ranked.empty()) return "";
  if (r.fitting.empty()) {
    const InferenceCandidate& best = r.unfit.front();
    return fmt::format(
        "no layout fits in {:.1f} GiB per GPU: the smallest need is {:.1f} GiB ({}; binding term: {} "
        "{:.1f} GiB on stage {}); use more GPUs, a smaller --batch or shorter requests",
        c.gpu.memory_gib, best.memory.terms.total() / kGiB, best.layout.describe(),
        best.memory.terms.largest_term(),
        std::max({best.memory.terms.weights, best.memory.terms.kv_cache, best.memory.terms.activations}) / kGiB,
        best.memory.stage);
  }
  // Best value any fitting layout reaches for each limit, and whether that limit alone fails.
  const auto by = [&](auto key) {
    return *std::min_element(r.fitting.begin(), r.fitting.end(),
                             [&](const auto& a, const auto& b) { return key(a) < key(b); });
  };
  std::string out = "no fitting layout meets every limit:";
  bool single = false;
  if (s.max_latency_ms > 0) {
    const auto best = by([](const InferenceCandidate& x) { return x.time.request; });
    if (best.time.request * 1e3 > s.max_latency_ms) {
      out += fmt::format("\n  --max-latency-ms {:g} binds: the lowest request latency is {:.1f} ms ({})",
                         s.max_latency_ms, best.time.request * 1e3, best.layout.describe());
      single = true;
    }
  }
  if (s.max_token_latency_ms > 0) {
    const auto best = by([](const InferenceCandidate& x) { return x.time.per_token; });
    if (best.time.per_token * 1e3 > s.max_token_latency_ms) {
      out += fmt::format("\n  --max-token-latency-ms {:g} binds: the lowest per-token latency is {:.2f} ms ({})",
                         s.max_token_latency_ms, best.time.per_token * 1e3, best.layout.describe());
      single = true;
    }
  }
  if (s.min_throughput > 0) {
    const auto best = by([](const InferenceCandidate& x) { return -x.time.tokens_per_s_cluster; });
    if (best.time.tokens_per_s_cluster < s.min_throughput) {
      out += fmt::format("\n  --min-throughput {:g} binds: the highest cluster throughput is {:.0f} tokens/s ({})",
                         s.min_throughput, best.time.tokens_per_s_cluster, best.layout.describe());
      single = true;
    }
  }
  if (!single) {
    // Each limit alone is reachable but no layout reaches all of them together.
    const auto best = by([](const InferenceCandidate& x) { return -x.time.tokens_per_s_cluster; });
    const auto fastest = by([](const InferenceCandidate& x) { return x.time.request; });
    out += fmt::format(
        "\n  each limit is reachable alone but not together: the lowest-latency layout ({}) gives "
        "{:.1f} ms per request, {:.2f} ms per token and {:.0f} tokens/s; the highest-throughput "
        "layout ({}) gives {:.1f} ms, {:.2f} ms and {:.0f} tokens/s",
        fastest.layout.describe(), fastest.time.request * 1e3, fastest.time.per_token * 1e3,
        fastest.time.tokens_per_s_cluster, best.layout.describe(), best.time.request * 1e3,
        best.time.per_token * 1e3, best.time.tokens_per_s_cluster);
  }
  return out;
}

}  // namespace loom::planner
