// `loom serve --checkpoint DIR [--tensor-parallel t] [--pipeline-parallel p] [--host H]
// [--port N] [--api-key-file FILE] [--max-batch B] [--max-kv-tokens K] [--max-num-batched-tokens N]
// [--no-prefix-caching] [--cuda-graphs auto|on|off] [--max-connections N] [--speculative-method ngram|draft] [--num-speculative-tokens K]
// [--prompt-lookup-max N] [--prompt-lookup-min N] [--draft-checkpoint DIR]
// [--chat-template FILE] [--lora NAME=DIR ...]`: serves a training checkpoint (any layout, resharded for t and split
// into p stages) over HTTP with NeMo's `PUT /generate`, OpenAI's `POST /v1/completions` and
// `POST /v1/chat/completions`, and Prometheus' `GET /metrics` (docs/serving.md), continuous batching
// in the engine (serve/engine.h). Rank 0 (first stage, TP rank 0) serves; the others follow
// its broadcasts. Without launcher variables and t·p > 1 it starts t·p local ranks of itself.
// Prints "loom serve: listening on http://HOST:PORT" on stderr once ready. SIGTERM/SIGINT:
// new requests get 503, the accepted ones finish, exit 0. A rank that dies ends the server
// with status 1; bad flags or checkpoint: 2. With --bench-out FILE it serves no HTTP: rank 0
// runs rounds of random prompts through the engine and writes their latency and throughput
// (serve/engine_benchmark.h; `loom plan infer --measure` runs this for each layout). With
// --prompt-checkpoint DIR requests may name a task of a prompt-learning run (NeMo's task_ids,
// OpenAI's taskname) with its template fields; its table is spliced in (serve/prompt_requests.h).
// With --lora NAME=DIR (repeatable) the LoRA adapters of loom finetune runs over this checkpoint
// are served beside it: OpenAI's `model` field names one, and requests of different adapters
// share each step's forward (serve/lora_modules.h, model/lora_serving.h).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <atomic>
#include <cctype>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <stdexcept>

#include "command_registry.h"
#include "error_text.h"
#include "input_errors.h"
#include "launch/env_rendezvous.h"
#include "launch/local_launcher.h"
#include "serve/limits.h"
#include "serve/serve_run.h"

namespace {

std::atomic<bool> g_stop{false};
void on_stop_signal(int) { g_stop = true; }

struct ServeJob {
  loom::serve::ServeRequest serve;
  std::string bench_out;  ///< --bench-out: measure the engine (no HTTP), its figures as JSON here
  loom::serve::BenchmarkWorkload bench;
  std::string api_key_file;  ///< --api-key-file: the key's first line
  std::string speculative_method = "none";  ///< --speculative-method
  std::string cuda_graphs = "auto";         ///< --cuda-graphs
  std::vector<std::string> lora;            ///< --lora NAME=DIR values
};

// --bench-out: the figures of the serving rank's benchmark, written and summed up.
void write_benchmark(const ServeJob& job, const loom::serve::BenchmarkResult& result, const std::string& who) {
  std::ofstream out(job.bench_out, std::ios::trunc);
  out << result.to_json().dump(2) << "\n";
  if (!out.flush()) throw std::runtime_error("--bench-out " + job.bench_out + ": cannot write the file");
  std::cerr << fmt::format("{}benchmark: {} requests, {:.1f} tokens/s, TTFT {:.1f} ms, {:.2f} ms/token -> {}\n", who,
                           result.requests, result.tokens_per_s, result.ttft_s * 1e3, result.token_s * 1e3,
                           job.bench_out);
}

// The served adapters' ids, one line ("" without --lora).
std::string lora_line(const loom::serve::ServeRequest& request, const std::string& who) {
  if (request.lora.empty()) return "";
  std::string line = who + "LoRA adapters (OpenAI's model field):";
  for (const auto& m : request.lora) line += " " + m.name + " (" + m.dir + ")";
  return line + "\n";
}

int run_rank(const ServeJob& job, const loom::launch::RendezvousInfo& info) {
  const std::string who = loom::cli::rank_prefix("serve", info);
  // Bad input (2) includes a flag only the engine checks (--max-batch, --bench-*) and the world size.
  return loom::cli::run_rank_body(who, [&] {
    if (info.rank == 0) {
      std::signal(SIGTERM, on_stop_signal);
      std::signal(SIGINT, on_stop_signal);
    } else {  // the serving rank stops the others once its requests are done
      std::signal(SIGTERM, SIG_IGN);
      std::signal(SIGINT, SIG_IGN);
    }
    const loom::serve::ServeRequest& request = job.serve;
    loom::serve::ServeEvents events;
    events.listening = [&](const loom::serve::ServingStarted& s) {
      std::cerr << fmt::format("{}model {} (iteration {}, t = {}, p = {}, max batch {}, max KV tokens {})\n", who,
                               request.model_name, s.iteration, s.layout.tp, s.layout.pp, s.max_batch,
                               s.max_kv_tokens)
                << lora_line(request, who)
                << fmt::format("{}chat template: {}\n", who,
                               s.chat_template.empty() ? "none (/v1/chat/completions answers 400)" : s.chat_template)
                << fmt::format("{}listening on http://{}:{}", who, request.http.host, s.port) << std::endl;
    };
    events.stopped = [&] { std::cerr << who << "stopped" << std::endl; };
    events.benchmarked = [&](const loom::serve::BenchmarkResult& r) { write_benchmark(job, r, who); };
    loom::serve::serve_on_rank(info, request, g_stop, events);
    return 0;
  });
}

// Every flag of `loom serve`, bound to the job (and to the two that need checking after parsing).
void add_serve_flags(CLI::App& app, ServeJob& job, int64_t& iteration, int64_t& max_body_mb) {
  app.add_option("--checkpoint", job.serve.model.checkpoint, "run directory (holding checkpoints/) or checkpoints directory");
  app.add_option("--prompt-checkpoint", job.serve.prompt_checkpoint,
                 "a prompt-learning run (or its prompt_tables/): requests may name its tasks "
                 "(default --checkpoint: the base it was tuned on)");
  app.add_option("--iteration", iteration, "checkpoint iteration (default: the latest)");
  app.add_option("--tensor-parallel", job.serve.model.tensor_parallel, "tensor-parallel ranks (default: the checkpoint's)");
  app.add_option("--pipeline-parallel", job.serve.pipeline_parallel, "pipeline stages")->capture_default_str();
  app.add_option("--host", job.serve.http.host, "address to listen on")->capture_default_str();
  app.add_option("--port", job.serve.http.port, "port (0: any free one, printed)")->capture_default_str();
  app.add_option("--api-key-file", job.api_key_file,
                 "require Authorization: Bearer KEY, KEY the file's first line (default: $LOOM_API_KEY, else none)");
  app.add_option("--api-key", job.serve.http.api_key,
                 "the key itself: visible to every user in the process list (ps); prefer $LOOM_API_KEY or --api-key-file");
  app.add_option("--max-batch", job.serve.engine.max_batch, "requests decoding together")->capture_default_str();
  app.add_option("--max-kv-tokens", job.serve.engine.max_kv_tokens,
                 "KV-cache positions of the paged block pool, in blocks of 16 (a request's prompt + max tokens must "
                 "fit; 0: max-batch x context)")
      ->capture_default_str();
  app.add_option("--max-num-batched-tokens", job.serve.engine.max_num_batched_tokens,
                 "tokens one engine step's forward holds at most: a token of every decoding request, the rest "
                 "chunks of joining prompts (chunked prefill); >= --max-batch; 0: max(" +
                     std::to_string(loom::serve::kDefaultMaxNumBatchedTokens) + ", --max-batch)")
      ->capture_default_str();
  app.add_flag_callback("--no-prefix-caching", [&job] { job.serve.engine.prefix_caching = false; },
                        "do not reuse the KV blocks of prompt prefixes shared with earlier requests");
  app.add_option("--cuda-graphs", job.cuda_graphs,
                 "decode steps (every request one token, no prefill chunk, no drafts, no LoRA adapter) at a fixed "
                 "batch-size bucket (1, 2, 4, 8, 16, 24, ... --max-batch), captured and replayed as CUDA graphs: auto "
                 "(on CUDA at --tensor-parallel 1 and --pipeline-parallel 1), on (any device; captured where auto "
                 "would, eager elsewhere), off (every step eager, as scheduled)")
      ->capture_default_str();
  auto& spec = job.serve.engine.speculative;
  app.add_option("--speculative-method", job.speculative_method,
                 "speculative decoding: none, or ngram (prompt lookup: drafts the tokens that followed the last "
                 "n-gram's earlier occurrence in the request's context, verified in the step's forward with exact "
                 "rejection sampling), or draft (a smaller model, --draft-checkpoint, drafts them)")
      ->capture_default_str();
  app.add_option("--draft-checkpoint", job.serve.draft_checkpoint,
                 "with --speculative-method draft: a run directory of a smaller model with the same tokenizer, "
                 "loaded whole on every rank");
  app.add_option("--num-speculative-tokens", spec.num_tokens, "tokens a decoding request drafts per step at most (>= 1)")
      ->capture_default_str();
  app.add_option("--prompt-lookup-max", spec.prompt_lookup_max, "ngram: longest n-gram looked up (>= --prompt-lookup-min)")
      ->capture_default_str();
  app.add_option("--prompt-lookup-min", spec.prompt_lookup_min, "ngram: shortest n-gram looked up (>= 1)")
      ->capture_default_str();
  app.add_option("--max-body-mb", max_body_mb, "largest request body in MiB, chunked ones included (413 beyond)")
      ->capture_default_str();
  app.add_option("--header-timeout-s", job.serve.http.header_timeout_s,
                 "a request's line and headers must arrive within this many seconds (408 beyond)")
      ->capture_default_str();
  app.add_option("--max-connections", job.serve.http.max_connections,
                 "open HTTP connections at most, and the listen backlog (a new one beyond gets 503)")
      ->capture_default_str();
  app.add_option("--chat-template", job.serve.chat_template,
                 "Jinja chat template for /v1/chat/completions (default: the run's tokenizer/chat_template.jinja, "
                 "which loom convert --from hf copies)");
  app.add_option("--lora", job.lora,
                 "NAME=DIR: serve the LoRA adapters of a loom finetune run over this checkpoint (the base they were "
                 "trained on) as model NAME; repeatable, requests of every adapter and the base batched together");
  app.add_option("--model-name", job.serve.model_name, "the model id the API reports (default: the checkpoint folder's name)");
  app.add_option("--vocab-file", job.serve.model.vocab_file, "GPT-2 vocab.json (default: the recipe's)");
  app.add_option("--merge-file", job.serve.model.merge_file, "GPT-2 merges.txt (default: the recipe's)");
  app.add_option("--accelerator", job.serve.model.accelerator, "cpu or gpu (default: the run's trainer.accelerator)");
  app.add_option("--bench-out", job.bench_out,
                 "measure the engine instead of serving: rounds of --bench-batch random prompts, figures as JSON to FILE");
  app.add_option("--bench-batch", job.bench.batch, "requests per benchmark round (<= --max-batch)")->capture_default_str();
  app.add_option("--bench-prompt-tokens", job.bench.prompt_tokens, "prompt tokens per benchmark request")
      ->capture_default_str();
  app.add_option("--bench-output-tokens", job.bench.output_tokens, "tokens generated per benchmark request")
      ->capture_default_str();
  app.add_option("--bench-rounds", job.bench.rounds, "timed benchmark rounds")->capture_default_str();
}

// The flags CLI11 cannot check alone, and the defaults that depend on others; false (with the
// error printed) for a bad flag.
bool finish_serve_flags(const CLI::App& app, ServeJob& job, int64_t iteration, int64_t max_body_mb) {
  if (app.count("--iteration")) job.serve.model.iteration = iteration;
  try {
    job.serve.engine.decode_graphs = loom::serve::parse_decode_graph_mode(job.cuda_graphs);
    auto& spec = job.serve.engine.speculative;
    spec.method = loom::serve::parse_speculative_method(job.speculative_method);
    if ((spec.method == loom::serve::SpeculativeMethod::kDraft) != !job.serve.draft_checkpoint.empty())
      throw std::invalid_argument("--draft-checkpoint goes with --speculative-method draft (and that method needs it)");
    if (spec.method != loom::serve::SpeculativeMethod::kNone) {
      validate(spec);
    } else if (app.count("--num-speculative-tokens") || app.count("--prompt-lookup-max") ||
               app.count("--prompt-lookup-min")) {
      throw std::invalid_argument("--num-speculative-tokens, --prompt-lookup-max and --prompt-lookup-min need "
                                  "--speculative-method ngram or draft");
    }
  } catch (const std::invalid_argument& e) {
    std::cerr << "loom serve: error: " << e.what() << "\n";
    return false;
  }
  try {
    for (const auto& value : job.lora) job.serve.lora.push_back(loom::serve::parse_lora_module(value));
  } catch (const std::invalid_argument& e) {
    std::cerr << "loom serve: error: " << e.what() << "\n";
    return false;
  }
  if (job.serve.model.checkpoint.empty() && job.serve.prompt_checkpoint.empty()) {
    std::cerr << "loom serve: error: --checkpoint DIR (or --prompt-checkpoint DIR) is required\n";
    return false;
  }
  if (app.count("--tensor-parallel") && job.serve.model.tensor_parallel < 1) {
    std::cerr << "loom serve: error: --tensor-parallel: expected an integer >= 1\n";
    return false;
  }
  if (max_body_mb < 1 || max_body_mb > loom::serve::limits::kMaxBodyMiBFlag) {
    std::cerr << "loom serve: error: --max-body-mb: expected 1.." << loom::serve::limits::kMaxBodyMiBFlag
              << ", found " << max_body_mb << "\n";
    return false;
  }
  job.serve.http.max_body_bytes = static_cast<size_t>(max_body_mb) << 20;
  if (job.serve.http.header_timeout_s < 1 || job.serve.http.header_timeout_s > 3600) {
    std::cerr << "loom serve: error: --header-timeout-s: expected 1..3600, found " << job.serve.http.header_timeout_s
              << "\n";
    return false;
  }
  if (job.serve.http.max_connections < 1 || job.serve.http.max_connections > loom::serve::limits::kMaxConnectionsFlag) {
    std::cerr << "loom serve: error: --max-connections: expected 1.." << loom::serve::limits::kMaxConnectionsFlag
              << ", found " << job.serve.http.max_connections << "\n";
    return false;
  }
  if (!job.api_key_file.empty() && app.count("--api-key")) {
    std::cerr << "loom serve: error: --api-key-file and --api-key: give one of them\n";
    return false;
  }
  if (!job.api_key_file.empty()) {
    std::ifstream in(job.api_key_file);
    std::string key;
    if (!in || !std::getline(in, key)) {
      std::cerr << "loom serve: error: --api-key-file " << job.api_key_file << ": cannot read the file\n";
      return false;
    }
    while (!key.empty() && std::isspace(static_cast<unsigned char>(key.back()))) key.pop_back();
    if (key.empty()) {
      std::cerr << "loom serve: error: --api-key-file " << job.api_key_file << ": the first line is empty\n";
      return false;
    }
    job.serve.http.api_key = key;
  }
  if (job.serve.http.api_key.empty())
    if (const char* key = std::getenv("LOOM_API_KEY")) job.serve.http.api_key = key;
  if (!job.bench_out.empty()) job.serve.benchmark = job.bench;
  if (job.serve.model_name.empty()) {
    const std::string& named =
        job.serve.model.checkpoint.empty() ? job.serve.prompt_checkpoint : job.serve.model.checkpoint;
    auto path = std::filesystem::absolute(named).lexically_normal();
    if (path.filename().empty()) path = path.parent_path();
    job.serve.model_name = path.filename().string();
  }
  return true;
}

int serve_command(int argc, char** argv) {
  CLI::App app{"Serve a training checkpoint over HTTP (NeMo and OpenAI completion APIs, continuous batching)."};
  ServeJob job;
  int64_t iteration = -1, max_body_mb = loom::serve::limits::kDefaultMaxBodyMiB;
  add_serve_flags(app, job, iteration, max_body_mb);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (!finish_serve_flags(app, job, iteration, max_body_mb)) return 2;

  loom::launch::RendezvousInfo info;
  try {
    info = loom::launch::rendezvous_from_env();
  } catch (const std::exception& e) {
    std::cerr << "loom serve: " << loom::cli::error_text(e) << "\n";
    return 2;
  }
  if (info.source != loom::launch::RendezvousSource::kSingleProcess) return run_rank(job, info);
  int ranks = 1;
  try {
    ranks = loom::serve::plan_serving(job.serve).tensor_parallel * job.serve.pipeline_parallel;
  } catch (const std::exception& e) {
    std::cerr << "loom serve: error: " << loom::cli::error_text(e) << "\n";
    return 2;
  }
  if (ranks == 1) return run_rank(job, info);
  loom::launch::LaunchOptions opt;
  opt.argv = {loom::launch::self_executable(), "serve"};
  for (int i = 1; i < argc; ++i) opt.argv.push_back(argv[i]);
  opt.nproc = ranks;
  opt.grace_s = 300;  // SIGTERM: the serving rank finishes the requests in flight
  try {
    auto result = loom::launch::launch_local(opt);
    if (result.exit_code() != 0) std::cerr << "loom serve: " << result.summary() << "\n";
    return result.exit_code();
  } catch (const std::exception& e) {
    std::cerr << "loom serve: cannot start the ranks: " << loom::cli::error_text(e) << "\n";
    return 1;
  }
}

}  // namespace

LOOM_REGISTER_COMMAND("serve", "serve a checkpoint over HTTP (NeMo and OpenAI APIs, batched)", serve_command);
