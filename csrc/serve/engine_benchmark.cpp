#include "serve/engine_benchmark.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <stdexcept>
#include <vector>

namespace loom::serve {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

void check_workload(const GenerationEngine& engine, const BenchmarkWorkload& w) {
  if (w.prompt_tokens < 1 || w.output_tokens < 1)
    throw std::invalid_argument(fmt::format("--bench-prompt-tokens {} and --bench-output-tokens {}: expected >= 1",
                                            w.prompt_tokens, w.output_tokens));
  if (w.prompt_tokens + w.output_tokens > engine.context())
    throw std::invalid_argument(fmt::format("--bench-prompt-tokens {} + --bench-output-tokens {} exceed the model's "
                                            "context of {} tokens",
                                            w.prompt_tokens, w.output_tokens, engine.context()));
  if (w.batch < 1 || w.batch > engine.options().max_batch)
    throw std::invalid_argument(
        fmt::format("--bench-batch {}: expected 1..--max-batch ({})", w.batch, engine.options().max_batch));
  if (w.batch * (w.prompt_tokens + w.output_tokens) > engine.options().max_kv_tokens)
    throw std::invalid_argument(fmt::format("--bench-batch {} requests of {} tokens exceed --max-kv-tokens {}", w.batch,
                                            w.prompt_tokens + w.output_tokens, engine.options().max_kv_tokens));
  if (w.rounds < 1) throw std::invalid_argument(fmt::format("--bench-rounds {}: expected >= 1", w.rounds));
}

// When one request was submitted and produced its tokens.
struct Timeline {
  Clock::time_point submitted;
  std::vector<Clock::time_point> tokens;
  bool done = false;
};

// Submits `batch` requests at once and steps the engine until all have finished.
std::vector<Timeline> run_round(GenerationEngine& engine, const BenchmarkWorkload& w, int64_t output_tokens,
                                std::mt19937_64& rng, int64_t vocab) {
  std::uniform_int_distribution<int64_t> token(0, vocab - 1);
  std::map<uint64_t, Timeline> timelines;
  for (int64_t i = 0; i < w.batch; ++i) {
    RequestSpec spec;
    for (int64_t j = 0; j < w.prompt_tokens; ++j) spec.prompt.push_back(token(rng));
    spec.max_new_tokens = output_tokens;
    spec.sampling.greedy = true;
    spec.stop_at_eod = false;  // every request generates exactly output_tokens
    const auto now = Clock::now();
    timelines[engine.submit(std::move(spec))].submitted = now;
  }
  size_t finished = 0;
  while (finished < timelines.size()) {
    engine.step(false, [&](const RequestProgress& p) {
      auto it = timelines.find(p.id);
      if (it == timelines.end()) return;
      const auto now = Clock::now();
      for (size_t k = 0; k < p.new_tokens.size(); ++k) it->second.tokens.push_back(now);
      if (p.finished != FinishReason::kNone && !it->second.done) {
        it->second.done = true;
        ++finished;
      }
    });
  }
  std::vector<Timeline> out;
  for (auto& [id, t] : timelines) out.push_back(std::move(t));
  return out;
}

}  // namespace

nlohmann::json BenchmarkResult::to_json() const {
  return {{"ttft_ms", ttft_s * 1e3},    {"token_ms", token_s * 1e3}, {"request_ms", request_s * 1e3},
          {"tokens_per_s", tokens_per_s}, {"wall_s", wall_s},          {"requests", requests},
          {"generated_tokens", generated_tokens}};
}

BenchmarkResult run_engine_benchmark(GenerationEngine& engine, const BenchmarkWorkload& w, int64_t vocab) {
  try {
    check_workload(engine, w);
  } catch (const std::invalid_argument&) {
    engine.step(true);  // the other ranks are waiting for a plan: stop them first
    throw;
  }
  std::mt19937_64 rng(w.seed);
  run_round(engine, w, std::min<int64_t>(2, w.output_tokens), rng, vocab);  // warm-up: allocations, caches

  BenchmarkResult r;
  double ttft = 0, interval = 0, request = 0;
  int64_t intervals = 0;
  for (int64_t round = 0; round < w.rounds; ++round) {
    const auto start = Clock::now();
    const auto timelines = run_round(engine, w, w.output_tokens, rng, vocab);
    r.wall_s += seconds_between(start, Clock::now());
    for (const Timeline& t : timelines) {
      if (t.tokens.empty()) throw std::logic_error("serve benchmark: a request finished without a token");
      ++r.requests;
      r.generated_tokens += static_cast<int64_t>(t.tokens.size());
      ttft += seconds_between(t.submitted, t.tokens.front());
      request += seconds_between(t.submitted, t.tokens.back());
      if (t.tokens.size() > 1) {
        interval += seconds_between(t.tokens.front(), t.tokens.back());
        intervals += static_cast<int64_t>(t.tokens.size()) - 1;
      }
    }
  }
  engine.step(true);  // every rank's loop ends
  r.ttft_s = ttft / static_cast<double>(r.requests);
  r.request_s = request / static_cast<double>(r.requests);
  r.token_s = intervals > 0 ? interval / static_cast<double>(intervals) : 0;
  r.tokens_per_s = r.wall_s > 0 ? static_cast<double>(r.generated_tokens) / r.wall_s : 0;
  return r;
}

}  // namespace loom::serve
