// The serving engine measured without HTTP (`loom serve --bench-out FILE`, which `loom plan
// infer --measure` runs for each layout; docs/serving.md, "Measuring a layout"): rounds of
// `batch` requests of `prompt_tokens` random token ids that all arrive at once and each
// generate exactly `output_tokens` tokens (greedy, <|endoftext|> not a stop), the shape of
// workload the inference planner predicts (docs/planner_inference.md). A warm-up round (two
// tokens per request) runs first and is not timed.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>

#include "serve/engine.h"

namespace loom::serve {

struct BenchmarkWorkload {
  int64_t prompt_tokens = 128;  ///< per request, >= 1
  int64_t output_tokens = 32;   ///< per request, >= 1
  int64_t batch = 1;            ///< requests per round (arriving together)
  int64_t rounds = 2;           ///< timed rounds, >= 1
  uint64_t seed = 1234;         ///< of the random prompts
};

/// Means over the timed requests (seconds), and the throughput of the timed rounds.
struct BenchmarkResult {
  double ttft_s = 0;           ///< submit → first generated token
  double token_s = 0;          ///< interval between a request's generated tokens
  double request_s = 0;        ///< submit → last generated token
  double tokens_per_s = 0;     ///< generated tokens / wall time of the rounds
  double wall_s = 0;           ///< the timed rounds together
  int64_t requests = 0;
  int64_t generated_tokens = 0;

  /// {"ttft_ms", "token_ms", "request_ms", "tokens_per_s", "wall_s", "requests",
  ///  "generated_tokens"}.
  nlohmann::json to_json() const;
};

/// Serving rank (the other ranks run follow(engine)): runs the warm-up and the timed rounds,
/// then stops every rank's engine. Throws std::invalid_argument naming the --bench-* flag for
/// a workload the engine cannot hold (prompt + output past the context, batch past
/// --max-batch or the KV budget), and whatever a step throws (a dead rank).
BenchmarkResult run_engine_benchmark(GenerationEngine& engine, const BenchmarkWorkload& workload, int64_t vocab);

}  // namespace loom::serve
