#include "serve/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace loom::serve {

namespace {

// Bucket bounds in seconds: vLLM's for the same quantities, so that dashboards built for one
// read the other.
const std::vector<double> kTtftBounds = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                         0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
const std::vector<double> kInterTokenBounds = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                               0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kE2eBounds = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                                        120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

const char* kFinishReasons[] = {"stop", "length", "cancelled", "error"};

double seconds(ServeMetrics::Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A sample value as the format writes numbers (integers without a fraction).
std::string number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{}", static_cast<int64_t>(v));
  return fmt::format("{}", v);
}

void family(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void sample(std::string& out, const std::string& name, double value) { out += name + " " + number(value) + "\n"; }

/// A family with one unlabelled sample (every gauge and counter here but the finish reasons).
void metric(std::string& out, const char* name, const char* type, const char* help, double value) {
  family(out, name, type, help);
  sample(out, name, value);
}

void histogram(std::string& out, const char* name, const char* help, const Histogram& h) {
  family(out, name, "histogram", help);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    cumulative += h.counts[i];
    sample(out, fmt::format("{}_bucket{{le=\"{}\"}}", name, number(h.bounds[i])), static_cast<double>(cumulative));
  }
  sample(out, fmt::format("{}_bucket{{le=\"+Inf\"}}", name), static_cast<double>(h.count));
  sample(out, fmt::format("{}_sum", name), h.sum);
  sample(out, fmt::format("{}_count", name), static_cast<double>(h.count));
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds) : bounds(std::move(upper_bounds)), counts(bounds.size(), 0) {}

void Histogram::observe(double value) {
  const auto it = std::lower_bound(bounds.begin(), bounds.end(), value);  // le: value <= bound
  if (it != bounds.end()) ++counts[static_cast<size_t>(it - bounds.begin())];
  sum += value;
  ++count;
}

ServeMetrics::ServeMetrics(int64_t kv_capacity_tokens)
    : kv_capacity_(kv_capacity_tokens), ttft_(kTtftBounds), inter_token_(kInterTokenBounds), e2e_(kE2eBounds) {
  for (const char* reason : kFinishReasons) finished_[reason] = 0;
}

void ServeMetrics::submitted(uint64_t id, const RequestSpec& spec, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  Tracked& t = requests_[id];
  t.submitted = now;
  t.prompt = static_cast<int64_t>(spec.prompt.size());
  t.reserved = kv_tokens(spec);
}

void ServeMetrics::progressed(const RequestProgress& p, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = requests_.find(p.id);
  if (it == requests_.end()) return;
  Tracked& t = it->second;
  if (!t.running && p.finished != FinishReason::kCancelled) {  // prefilled in this step
    t.running = true;
    prompt_tokens_ += t.prompt;
  }
  for (size_t i = 0; i < p.new_tokens.size(); ++i) {
    if (t.generated == 0) ttft_.observe(seconds(now - t.submitted));
    else inter_token_.observe(seconds(now - t.last_token));
    t.last_token = now;
    ++t.generated;
    ++generation_tokens_;
  }
  if (p.finished == FinishReason::kNone) return;
  const char* reason = "stop";
  switch (p.finished) {
    case FinishReason::kMaxNewTokens:
    case FinishReason::kContextFull: reason = "length"; break;
    case FinishReason::kCancelled: reason = "cancelled"; break;
    case FinishReason::kError: reason = "error"; break;
    default: break;
  }
  end(it, reason, now);
}

void ServeMetrics::cancelled(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = requests_.find(id);
  if (it != requests_.end() && !it->second.running) end(it, "cancelled", Clock::now());
}

void ServeMetrics::end(std::map<uint64_t, Tracked>::iterator it, const std::string& reason, Clock::time_point now) {
  ++finished_[reason];
  if (reason != "cancelled" && reason != "error") e2e_.observe(seconds(now - it->second.submitted));
  requests_.erase(it);
}

void ServeMetrics::prefix_cache_totals(int64_t queried_tokens, int64_t hit_tokens) {
  std::lock_guard<std::mutex> lock(mutex_);
  prefix_queries_ = std::max(prefix_queries_, queried_tokens);
  prefix_hits_ = std::max(prefix_hits_, hit_tokens);
}

void ServeMetrics::speculation_totals(int64_t drafted_tokens, int64_t accepted_tokens) {
  std::lock_guard<std::mutex> lock(mutex_);
  drafted_ = std::max(drafted_, drafted_tokens);
  accepted_ = std::max(accepted_, accepted_tokens);
}

void ServeMetrics::mixed_adapter_steps(int64_t steps) {
  std::lock_guard<std::mutex> lock(mutex_);
  mixed_adapter_steps_ = std::max(mixed_adapter_steps_, steps);
}

void ServeMetrics::decode_bucket_steps(int64_t steps) {
  std::lock_guard<std::mutex> lock(mutex_);
  decode_bucket_steps_ = std::max(decode_bucket_steps_, steps);
}

std::string ServeMetrics::exposition(int64_t open_connections) const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t running = 0, waiting = 0, used = 0, reserved = 0;
  for (const auto& [id, t] : requests_) {
    if (!t.running) {
      ++waiting;
      continue;
    }
    ++running;
    used += t.prompt + t.generated;
    reserved += t.reserved;
  }
  std::string out;
  metric(out, "loom:num_requests_running", "gauge", "Requests in the engine's batch (their prompt prefilled).",
         static_cast<double>(running));
  metric(out, "loom:num_requests_waiting", "gauge", "Requests queued for the engine, not yet prefilled.",
         static_cast<double>(waiting));
  metric(out, "loom:kv_cache_usage_tokens", "gauge",
         "KV-cache positions holding the running requests' tokens (prompt + generated).", static_cast<double>(used));
  metric(out, "loom:kv_cache_reserved_tokens", "gauge",
         "KV-cache positions the running requests reserve (prompt + max_tokens each), what admission counts.",
         static_cast<double>(reserved));
  metric(out, "loom:kv_cache_capacity_tokens", "gauge",
         "KV-cache positions the running requests may reserve (--max-kv-tokens).", static_cast<double>(kv_capacity_));
  metric(out, "loom:kv_cache_usage_perc", "gauge",
         "Fraction of the KV-cache capacity holding tokens (kv_cache_usage_tokens / kv_cache_capacity_tokens).",
         kv_capacity_ > 0 ? static_cast<double>(used) / kv_capacity_ : 0.0);
  metric(out, "loom:prefix_cache_hit_rate", "gauge",
         "Fraction of looked-up prompt tokens found in the prefix cache; always 0: the engine does not cache "
         "prefixes yet.",
         prefix_queries_ > 0 ? static_cast<double>(prefix_hits_) / prefix_queries_ : 0.0);
  metric(out, "loom:prefix_cache_queries_total", "counter",
         "Prompt tokens looked up in the prefix cache; 0: the engine does not cache prefixes yet.",
         static_cast<double>(prefix_queries_));
  metric(out, "loom:prefix_cache_hits_total", "counter",
         "Prompt tokens found in the prefix cache; 0: the engine does not cache prefixes yet.",
         static_cast<double>(prefix_hits_));
  metric(out, "loom:spec_decode_num_draft_tokens_total", "counter",
         "Tokens drafted by speculative decoding (--speculative-method) and verified.", static_cast<double>(drafted_));
  metric(out, "loom:spec_decode_num_accepted_tokens_total", "counter", "Drafted tokens accepted.",
         static_cast<double>(accepted_));
  metric(out, "loom:lora_mixed_steps_total", "counter",
         "Engine steps whose one forward held the tokens of two or more served models (the base and LoRA "
         "adapters, --lora).",
         static_cast<double>(mixed_adapter_steps_));
  metric(out, "loom:decode_bucket_steps_total", "counter",
         "Decode steps run at a fixed batch-size bucket (--cuda-graphs: replayed CUDA graphs on CUDA).",
         static_cast<double>(decode_bucket_steps_));
  metric(out, "loom:prompt_tokens_total", "counter", "Prompt tokens prefilled.", static_cast<double>(prompt_tokens_));
  metric(out, "loom:generation_tokens_total", "counter", "Tokens generated.", static_cast<double>(generation_tokens_));
  family(out, "loom:requests_finished_total", "counter", "Requests ended, by finish reason.");
  for (const auto& [reason, n] : finished_)
    sample(out, fmt::format("loom:requests_finished_total{{finished_reason=\"{}\"}}", reason), static_cast<double>(n));
  metric(out, "loom:open_connections", "gauge", "HTTP connections open (at most --max-connections).",
         static_cast<double>(open_connections));
  histogram(out, "loom:time_to_first_token_seconds", "Seconds from a request's submission to its first token.",
            ttft_);
  histogram(out, "loom:inter_token_latency_seconds", "Seconds between a request's consecutive tokens.",
            inter_token_);
  histogram(out, "loom:e2e_request_latency_seconds",
            "Seconds from a request's submission to its end (stop or length).", e2e_);
  return out;
}

}  // namespace loom::serve
