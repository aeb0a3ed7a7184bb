// `GET /metrics` of `loom serve` (serve/metrics.h): a scripted life of three requests on a fake
// clock gives the exact gauges, counters and histogram buckets in Prometheus' text format.
#include <catch2/catch.hpp>

#include <sstream>
#include <string>

#include "serve/metrics.h"

using loom::serve::FinishReason;
using loom::serve::Histogram;
using loom::serve::RequestProgress;
using loom::serve::RequestSpec;
using loom::serve::ServeMetrics;

namespace {

using namespace std::chrono_literals;

// The line of `name` (with its labels, exactly) in `text`, its value; fails when absent.
std::string value_of(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(name + " ", 0) == 0) return line.substr(name.size() + 1);
  FAIL("no sample " << name << " in\n" << text);
  return "";
}

RequestSpec spec(int prompt, int max_new) {
  RequestSpec s;
  s.prompt.assign(static_cast<size_t>(prompt), 1);
  s.max_new_tokens = max_new;
  return s;
}

RequestProgress tokens(uint64_t id, int n, FinishReason finished = FinishReason::kNone) {
  RequestProgress p;
  p.id = id;
  p.new_tokens.resize(static_cast<size_t>(n));
  p.finished = finished;
  return p;
}

}  // namespace

TEST_CASE("Histogram: counts per upper bound, le inclusive") {
  Histogram h({0.1, 1.0});
  for (double v : {0.05, 0.1, 0.5, 3.0}) h.observe(v);
  CHECK(h.counts == std::vector<uint64_t>{2, 1});
  CHECK(h.count == 4);
  CHECK(h.sum == Approx(3.65));
}

TEST_CASE("ServeMetrics: waiting, running, tokens, latencies and finish reasons") {
  ServeMetrics m(1000);
  const auto t0 = ServeMetrics::Clock::time_point{} + 100s;
  m.submitted(1, spec(10, 5), t0);
  m.submitted(2, spec(4, 8), t0);
  m.submitted(3, spec(7, 3), t0);
  std::string text = m.exposition(3);
  CHECK(value_of(text, "loom:num_requests_waiting") == "3");
  CHECK(value_of(text, "loom:num_requests_running") == "0");
  CHECK(value_of(text, "loom:open_connections") == "3");

  m.progressed(tokens(1, 1), t0 + 30ms);  // prefilled: its first token after 30 ms
  m.progressed(tokens(2, 1), t0 + 30ms);
  m.cancelled(3);                           // dropped while queued
  text = m.exposition(2);
  CHECK(value_of(text, "loom:num_requests_waiting") == "0");
  CHECK(value_of(text, "loom:num_requests_running") == "2");
  CHECK(value_of(text, "loom:kv_cache_usage_tokens") == "16");     // 10 + 1 and 4 + 1
  CHECK(value_of(text, "loom:kv_cache_reserved_tokens") == "27");  // 15 and 12
  CHECK(value_of(text, "loom:kv_cache_usage_perc") == "0.016");
  CHECK(value_of(text, "loom:prompt_tokens_total") == "14");
  CHECK(value_of(text, "loom:requests_finished_total{finished_reason=\"cancelled\"}") == "1");

  m.progressed(tokens(1, 1), t0 + 80ms);  // 50 ms after its first
  m.progressed(tokens(2, 1, FinishReason::kStop), t0 + 80ms);
  m.progressed(tokens(1, 1, FinishReason::kMaxNewTokens), t0 + 280ms);  // 200 ms later
  m.progressed(tokens(9, 1), t0 + 300ms);  // unknown: ignored
  text = m.exposition(0);
  CHECK(value_of(text, "loom:num_requests_running") == "0");
  CHECK(value_of(text, "loom:kv_cache_usage_tokens") == "0");
  CHECK(value_of(text, "loom:generation_tokens_total") == "5");
  CHECK(value_of(text, "loom:requests_finished_total{finished_reason=\"stop\"}") == "1");
  CHECK(value_of(text, "loom:requests_finished_total{finished_reason=\"length\"}") == "1");
  CHECK(value_of(text, "loom:requests_finished_total{finished_reason=\"error\"}") == "0");
  // Two first tokens at 30 ms (bucket le=0.04 and above).
  CHECK(value_of(text, "loom:time_to_first_token_seconds_bucket{le=\"0.02\"}") == "0");
  CHECK(value_of(text, "loom:time_to_first_token_seconds_bucket{le=\"0.04\"}") == "2");
  CHECK(value_of(text, "loom:time_to_first_token_seconds_bucket{le=\"+Inf\"}") == "2");
  CHECK(std::stod(value_of(text, "loom:time_to_first_token_seconds_sum")) == Approx(0.06));
  // Gaps of 50, 50 and 200 ms.
  CHECK(value_of(text, "loom:inter_token_latency_seconds_bucket{le=\"0.05\"}") == "2");
  CHECK(value_of(text, "loom:inter_token_latency_seconds_bucket{le=\"0.15\"}") == "2");
  CHECK(value_of(text, "loom:inter_token_latency_seconds_bucket{le=\"0.2\"}") == "3");
  CHECK(value_of(text, "loom:inter_token_latency_seconds_count") == "3");
  CHECK(value_of(text, "loom:e2e_request_latency_seconds_count") == "2");
  CHECK(value_of(text, "loom:prefix_cache_hit_rate") == "0");
  CHECK(value_of(text, "loom:spec_decode_num_draft_tokens_total") == "0");
  m.speculation_totals(12, 7);
  m.speculation_totals(10, 5);  // older totals: ignored
  text = m.exposition(0);
  CHECK(value_of(text, "loom:spec_decode_num_draft_tokens_total") == "12");
  CHECK(value_of(text, "loom:spec_decode_num_accepted_tokens_total") == "7");
  CHECK(value_of(text, "loom:decode_bucket_steps_total") == "0");
  m.decode_bucket_steps(9);
  m.decode_bucket_steps(4);  // older total: ignored
  CHECK(value_of(m.exposition(0), "loom:decode_bucket_steps_total") == "9");
  // Every family is announced with HELP and TYPE before its samples.
  CHECK(text.find("# TYPE loom:time_to_first_token_seconds histogram\n") != std::string::npos);
  CHECK(text.find("# TYPE loom:prompt_tokens_total counter\n") != std::string::npos);
  CHECK(text.find("# HELP loom:prefix_cache_hit_rate ") != std::string::npos);
}
