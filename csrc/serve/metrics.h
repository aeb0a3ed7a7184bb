// `GET /metrics` of `loom serve` (docs/serving.md, "Metrics"): what the serving rank's requests
// did, in Prometheus' text exposition format 0.0.4, names prefixed `loom:` as vLLM prefixes its
// own `vllm:`. The HTTP server feeds it the life of every engine request (submitted, each
// step's progress, dropped while queued) and renders it on each scrape:
//   gauges     loom:num_requests_running, loom:num_requests_waiting, loom:kv_cache_usage_tokens,
//              loom:kv_cache_reserved_tokens, loom:kv_cache_capacity_tokens,
//              loom:kv_cache_usage_perc (0..1), loom:prefix_cache_hit_rate (0..1),
//              loom:open_connections
//   counters   loom:prompt_tokens_total, loom:generation_tokens_total,
//              loom:requests_finished_total{finished_reason}, loom:prefix_cache_queries_total,
//              loom:prefix_cache_hits_total (tokens/s is rate() of the token counters),
//              loom:lora_mixed_steps_total (steps whose one forward held several served models)
//   histograms loom:time_to_first_token_seconds, loom:inter_token_latency_seconds,
//              loom:e2e_request_latency_seconds
// Times are the serving rank's steady clock, from submission to the step that reported the
// token. Thread-safe.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "serve/engine.h"
#include "serve/request.h"

namespace loom::serve {

/// A Prometheus histogram: cumulative counts per upper bound (seconds), their sum and count.
struct Histogram {
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  std::vector<double> bounds;     ///< increasing; +Inf is implied
  std::vector<uint64_t> counts;   ///< per bound, not cumulative (made cumulative when rendered)
  double sum = 0;
  uint64_t count = 0;
};

class ServeMetrics {
 public:
  using Clock = std::chrono::steady_clock;

  /// `kv_capacity_tokens`: the KV-cache positions the running requests may reserve (the
  /// engine's max_kv_tokens).
  explicit ServeMetrics(int64_t kv_capacity_tokens);

  /// An engine request was queued (it waits until its first progress report).
  void submitted(uint64_t id, const RequestSpec& spec, Clock::time_point now = Clock::now());
  /// One step's progress of a request (the engine's report): the first one starts it (it runs:
  /// its prompt was prefilled), each new token counts, a finished one ends it. Unknown ids are
  /// ignored.
  void progressed(const RequestProgress& progress, Clock::time_point now = Clock::now());
  /// A request cancelled by its client: one still waiting ends here (the engine drops it
  /// without a report); a running one ends with the engine's kCancelled report.
  void cancelled(uint64_t id);
  /// The engine's prefix-cache totals so far (KvBlockPool::stats): prompt tokens looked up and
  /// found cached. Counters, so a smaller value than the last one is ignored.
  void prefix_cache_totals(int64_t queried_tokens, int64_t hit_tokens);
  /// The engine's speculative-decoding totals so far: tokens drafted and drafted tokens
  /// accepted (counters, as prefix_cache_totals).
  void speculation_totals(int64_t drafted_tokens, int64_t accepted_tokens);
  /// The engine's count of steps whose one forward held the tokens of two or more served
  /// models (the base and LoRA adapters; GenerationEngine::mixed_adapter_steps), as above.
  void mixed_adapter_steps(int64_t steps);
  /// The engine's count of decode steps run at a batch-size bucket (DecodeGraphStats::steps;
  /// --cuda-graphs), as above.
  void decode_bucket_steps(int64_t steps);

  /// The text exposition (format 0.0.4) of every metric; `open_connections` is the HTTP
  /// front's count at the scrape.
  std::string exposition(int64_t open_connections) const;

 private:
  struct Tracked {
    Clock::time_point submitted, last_token;
    bool running = false;
    int64_t prompt = 0, generated = 0, reserved = 0;
  };
  void end(std::map<uint64_t, Tracked>::iterator it, const std::string& reason, Clock::time_point now);

  mutable std::mutex mutex_;
  int64_t kv_capacity_;
  std::map<uint64_t, Tracked> requests_;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0;
  int64_t prefix_queries_ = 0, prefix_hits_ = 0;
  int64_t drafted_ = 0, accepted_ = 0;
  int64_t mixed_adapter_steps_ = 0;
  int64_t decode_bucket_steps_ = 0;
  std::map<std::string, int64_t> finished_;  // by finish_reason
  Histogram ttft_, inter_token_, e2e_;
};

}  // namespace loom::serve
