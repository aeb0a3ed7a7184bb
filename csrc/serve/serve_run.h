// `loom serve` end to end, minus the command line and process spawning (docs/serving.md):
// plan_serving checks everything before any rank starts (the checkpoint or the base a learned
// prompt's tables name, the pipeline split, the engine's limits, the port); serve_on_rank is
// one rank, started by runtime::start_rank_session (docs/architecture.md, "One rank session"):
// it builds this rank's stage of the model from the checkpoint and the engine, then rank 0
// (first stage, TP rank 0) serves HTTP or runs the benchmark while every other rank follows
// its steps.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "generate/generate_run.h"
#include "launch/env_rendezvous.h"
#include "rules/layout.h"
#include "serve/engine.h"
#include "serve/engine_benchmark.h"
#include "serve/http_server.h"
#include "serve/lora_modules.h"

namespace loom::serve {

/// What `loom serve` was asked (its flags, checked and defaulted by the command).
struct ServeRequest {
  /// --checkpoint (empty with prompt_checkpoint: the base its tables name), --iteration,
  /// --tensor-parallel, the tokenizer flags, --accelerator.
  generate::GenerateRequest model;
  int pipeline_parallel = 1;      ///< --pipeline-parallel: stages, a divisor of the layers
  HttpOptions http;               ///< --host, --port, the API key, body and header limits
  EngineOptions engine;           ///< --max-batch, --max-kv-tokens (the rest is set on the rank)
  std::string model_name;         ///< the model id the APIs report
  std::string prompt_checkpoint;  ///< --prompt-checkpoint: a prompt-learning run's tables (empty: none)
  /// --draft-checkpoint (with --speculative-method draft): a smaller run with the served
  /// model's vocabulary, loaded whole (t = 1) on every rank as the draft model.
  std::string draft_checkpoint;
  /// --chat-template: a Jinja chat template file (empty: the run's tokenizer/chat_template.jinja
  /// when it has one, else chat requests are refused).
  std::string chat_template;
  /// --lora NAME=DIR (repeatable): LoRA adapter checkpoints of the served checkpoint, each
  /// served under NAME beside the base (serve/lora_modules.h).
  std::vector<LoraModule> lora;
  /// --bench-out: rank 0 measures the engine with this workload instead of serving HTTP.
  std::optional<BenchmarkWorkload> benchmark;
};

/// Rank 0's serving has started: the server listens on `port`.
struct ServingStarted {
  int64_t iteration = 0;  ///< of the served checkpoint
  Layout layout;          ///< its t and p (rules/layout.h; d = 1, other fields unread)
  int64_t max_batch = 0, max_kv_tokens = 0;  ///< the engine's (max_kv_tokens resolved)
  int port = 0;
  std::string chat_template;  ///< the chat template file ("" : none, chat requests are refused)
};

/// What rank 0 reports (called on rank 0 only, on the rank's thread; each may be empty). An
/// exception thrown by one ends the rank as a failure of serve_on_rank would.
struct ServeEvents {
  std::function<void(const ServingStarted&)> listening;  ///< before the first request is served
  std::function<void()> stopped;                         ///< `stop` was seen, the accepted requests finished
  std::function<void(const BenchmarkResult&)> benchmarked;  ///< with a benchmark, its figures
};

/// The chat template file the server uses: --chat-template, else RUN/tokenizer/
/// chat_template.jinja of the served run when it exists, else "" (none).
std::string chat_template_path(const ServeRequest& request, const generate::GeneratePlan& plan);

/// Checks everything before any rank starts; the plan of the served checkpoint (its
/// tensor_parallel × request.pipeline_parallel ranks serve). Throws
/// generate::GenerateInputError naming the flag (a chat template that does not read or parse,
/// --prompt-checkpoint tables that do not read,
/// --pipeline-parallel not dividing the layers, a --lora adapter of another checkpoint or a
/// repeated --lora name, a --draft-checkpoint whose vocabulary differs, --max-batch < 1, --max-kv-tokens < 0, --port
/// outside 0..65535), or train::CheckpointError for the checkpoint.
generate::GeneratePlan plan_serving(const ServeRequest& request);

/// One rank of `loom serve` (collective over the job's ranks, every one with the same
/// request): starts the rank (runtime::start_rank_session: t × p ranks, std::invalid_argument
/// for another world size or a device the host lacks; collectives time out after 60 s), loads
/// this rank's stage and the learned prompts' tables (GenerateInputError when they were tuned
/// on another checkpoint or another hidden size), builds the engine; then rank 0 serves HTTP
/// until `stop` becomes true (or runs the benchmark) and the other ranks follow its steps.
/// Returns once every rank's engine has stopped and the groups are shut down. Throws
/// std::invalid_argument for engine options or a benchmark workload the engine refuses, and
/// what a step throws (a dead rank, a collective timeout).
void serve_on_rank(const launch::RendezvousInfo& info, ServeRequest request, const std::atomic<bool>& stop,
                   const ServeEvents& events);

}  // namespace loom::serve
