// `loom serve --checkpoint DIR [--tensor-parallel t] [--pipeline-parallel p] [--host H]
// [--port N] [--api-key-file FILE] [--max-batch B] [--max-kv-tokens K]`: serves a training
// checkpoint (any layout, resharded for t and split into p stages) over HTTP with NeMo's
// `PUT /generate` and OpenAI's `POST /v1/completions` (docs/serving.md), continuous batching
// in the engine (serve/engine.h). Rank 0 (first stage, TP rank 0) serves; the others follow
// its broadcasts. Without launcher variables and t·p > 1 it starts t·p local ranks of itself.
// Prints "loom serve: listening on http://HOST:PORT" on stderr once ready. SIGTERM/SIGINT:
// new requests get 503, the accepted ones finish, exit 0. A rank that dies ends the server
// with status 1; bad flags or checkpoint: 2. With --bench-out FILE it serves no HTTP: rank 0
// runs rounds of random prompts through the engine and writes their latency and throughput
// (serve/engine_benchmark.h; `loom plan infer --measure` runs this for each layout). With
// --prompt-checkpoint DIR requests may name a task of a prompt-learning run (NeMo's task_ids,
// OpenAI's taskname) with its template fields; its table is spliced in (serve/prompt_requests.h).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <atomic>
#include <cctype>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include "command_registry.h"
#include "error_text.h"
#include "input_errors.h"
#include "config/recipe.h"
#include "data/data_error.h"
#include "generate/generate_run.h"
#include "launch/env_rendezvous.h"
#include "launch/local_launcher.h"
#include "model/gpt_stage.h"
#include "ptune/frozen_base.h"
#include "ptune/prompt_tables.h"
#include "runtime/cpu_threads.h"
#include "runtime/process_groups.h"
#include "serve/engine_benchmark.h"
#include "serve/http_server.h"
#include "serve/limits.h"
#include "serve/prompt_requests.h"
#include "train/checkpoint.h"

namespace {

std::atomic<bool> g_stop{false};
void on_stop_signal(int) { g_stop = true; }

struct ServeJob {
  loom::generate::GenerateRequest request;  // checkpoint, iteration, t, tokenizer, accelerator
  int pipeline_parallel = 1;
  loom::serve::HttpOptions http;
  loom::serve::EngineOptions engine;
  std::string model_name;
  std::string bench_out;  ///< --bench-out: measure the engine (no HTTP), its figures as JSON here
  loom::serve::BenchmarkWorkload bench;
  std::string prompt_checkpoint;  ///< --prompt-checkpoint: a prompt-learning run's inference tables
  std::string api_key_file;       ///< --api-key-file: the key's first line
};

// --prompt-checkpoint's tables (GenerateInputError naming the flag when they do not read).
loom::ptune::PromptTables read_tables(const ServeJob& job) {
  try {
    return loom::ptune::read_prompt_tables(job.prompt_checkpoint);
  } catch (const std::invalid_argument& e) {
    throw loom::generate::GenerateInputError(std::string("--prompt-checkpoint: ") + e.what());
  }
}

// The checkpoint to serve: --checkpoint, else the base the tables were tuned on (the tables
// are read either way, so that bad ones are named before any rank starts).
loom::generate::GenerateRequest checkpoint_request(const ServeJob& job) {
  loom::generate::GenerateRequest request = job.request;
  if (job.prompt_checkpoint.empty()) return request;
  const auto tables = read_tables(job);
  if (!request.checkpoint.empty()) return request;
  if (!tables.base.contains("checkpoints"))
    throw loom::generate::GenerateInputError("--prompt-checkpoint: the tables do not name their base; pass --checkpoint");
  request.checkpoint = tables.base["checkpoints"].get<std::string>();
  if (!request.iteration) request.iteration = tables.base.value("iteration", int64_t{0});
  return request;
}

// The tables on `device` for the engine, checked against the loaded base: tuned on this very
// checkpoint (its digest), vectors of the model's hidden size.
std::vector<at::Tensor> device_tables(const loom::ptune::PromptTables& tables, const loom::generate::FullCheckpoint& base,
                                      int64_t hidden, const c10::Device& device) {
  if (tables.base.contains("checkpoint_digest") && tables.base["checkpoint_digest"] != loom::ptune::checkpoint_digest(base))
    throw loom::generate::GenerateInputError(fmt::format(
        "--prompt-checkpoint: the tables were tuned on the base with checkpoint digest {}; iteration {} of the served "
        "checkpoint is another model", tables.base["checkpoint_digest"].get<std::string>(), base.info.iteration));
  std::vector<at::Tensor> out;
  for (const auto& t : tables.tasks) {
    if (t.vectors.size(1) != hidden)
      throw loom::generate::GenerateInputError(fmt::format(
          "--prompt-checkpoint: task '{}' has vectors of size {}, the model {}", t.spec.taskname, t.vectors.size(1), hidden));
    out.push_back(t.vectors.to(device));
  }
  return out;
}

// --bench-out: the serving rank runs the benchmark rounds and writes their figures.
void run_benchmark(const ServeJob& job, loom::serve::GenerationEngine& engine, int64_t vocab, const std::string& who) {
  const auto result = loom::serve::run_engine_benchmark(engine, job.bench, vocab);
  std::ofstream out(job.bench_out, std::ios::trunc);
  out << result.to_json().dump(2) << "\n";
  if (!out.flush()) throw std::runtime_error("--bench-out " + job.bench_out + ": cannot write the file");
  std::cerr << fmt::format("{}benchmark: {} requests, {:.1f} tokens/s, TTFT {:.1f} ms, {:.2f} ms/token -> {}\n", who,
                           result.requests, result.tokens_per_s, result.ttft_s * 1e3, result.token_s * 1e3,
                           job.bench_out);
}

// Checks everything before any rank starts; throws GenerateInputError naming the flag.
loom::generate::GeneratePlan plan(const ServeJob& job) {
  auto plan = loom::generate::plan_generation(checkpoint_request(job));
  const auto config = loom::generate::inference_config(plan.info.layout.model_shape, plan.model_options);
  if (job.pipeline_parallel < 1 || config.num_layers % job.pipeline_parallel != 0)
    throw loom::generate::GenerateInputError(fmt::format(
        "--pipeline-parallel {}: expected a divisor of the model's {} layers", job.pipeline_parallel, config.num_layers));
  if (job.engine.max_batch < 1)
    throw loom::generate::GenerateInputError(fmt::format("--max-batch: expected >= 1, found {}", job.engine.max_batch));
  if (job.engine.max_kv_tokens < 0)
    throw loom::generate::GenerateInputError(
        fmt::format("--max-kv-tokens: expected >= 0 (0: max-batch x context), found {}", job.engine.max_kv_tokens));
  if (job.http.port < 0 || job.http.port > 65535)
    throw loom::generate::GenerateInputError(fmt::format("--port: expected 0..65535, found {}", job.http.port));
  return plan;
}

int run_rank(ServeJob job, const loom::launch::RendezvousInfo& info) {
  const std::string who = info.world_size > 1 ? fmt::format("loom serve: [rank {}] ", info.rank) : "loom serve: ";
  auto fail = [&](int code, const std::string& what) {
    loom::launch::record_rank_error(what);
    std::cerr << who << "error: " << what << std::endl;
    return code;
  };
  try {
    const auto p = plan(job);
    const int t = p.tensor_parallel, pp = job.pipeline_parallel;
    if (info.world_size != t * pp)
      return fail(2, fmt::format("{} ranks were started for t = {} x p = {}", info.world_size, t, pp));
    if (info.rank == 0) {
      std::signal(SIGTERM, on_stop_signal);
      std::signal(SIGINT, on_stop_signal);
    } else {  // the serving rank stops the others once its requests are done
      std::signal(SIGTERM, SIG_IGN);
      std::signal(SIGINT, SIG_IGN);
    }
    loom::runtime::use_fair_share_of_cores(info.local_world_size);
    loom::runtime::ProcessGroupOptions opt;
    opt.tensor_parallel = t;
    opt.pipeline_parallel = pp;
    opt.timeout = std::chrono::seconds(60);
    opt.device = loom::runtime::select_run_device(
        p.accelerator ? loom::runtime::DeviceKind::kAccelerator : loom::runtime::DeviceKind::kCpu, info.local_rank);
    auto groups = loom::runtime::ProcessGroups::create(info, opt);
    const auto config = loom::generate::inference_config(p.info.layout.model_shape, p.model_options);
    const auto coords = groups->coords();
    loom::model::GptStage stage(config, groups->tensor_ptr(),
                                loom::model::pipeline_stage_layouts(config, pp, 1, coords.pp).front(), groups->device());
    std::optional<loom::ptune::PromptTables> tables;
    {
      const auto checkpoint = loom::generate::read_full_checkpoint(p.location.checkpoints, p.info);
      loom::generate::fill_stage_parameters(checkpoint, stage, coords.tp, t);
      if (!job.prompt_checkpoint.empty()) {
        tables = read_tables(job);
        job.engine.prompt_tables = device_tables(*tables, checkpoint, config.hidden_size, groups->device());
      }
    }
    const auto loaded_tokenizer = loom::generate::load_tokenizer(p);  // the run's (any library), checked
    const loom::data::Tokenizer& tokenizer = *loaded_tokenizer;
    job.engine.eod_id = tokenizer.eod_id();
    job.engine.decode = [&tokenizer](const std::vector<int64_t>& ids) {
      return tokenizer.decode(std::vector<int32_t>(ids.begin(), ids.end()));
    };
    loom::serve::EngineGroups eg{groups->tensor_ptr(), &groups->pipeline_links(), &groups->host_world(),
                                 groups->layout().rank_of({0, 0, pp - 1})};
    loom::serve::GenerationEngine engine(stage, eg, job.engine);
    if (info.rank == 0 && !job.bench_out.empty()) {
      run_benchmark(job, engine, config.vocab_size, who);
    } else if (info.rank == 0) {
      std::optional<loom::serve::PromptTasks> tasks;
      if (tables) {
        std::vector<loom::config::TaskTemplate> templates;
        for (const auto& task : tables->tasks) templates.push_back(task.spec);
        tasks = loom::serve::make_prompt_tasks(templates, tables->add_bos, tokenizer, config.max_position_embeddings);
      }
      loom::serve::ApiContext api{&tokenizer, config.max_position_embeddings, job.model_name,
                                  tasks ? &*tasks : nullptr,
                                  loom::serve::max_prompt_bytes(tokenizer, config.max_position_embeddings)};
      loom::serve::HttpServer server(engine, api, job.http);
      std::cerr << fmt::format("{}model {} (iteration {}, t = {}, p = {}, max batch {}, max KV tokens {})\n", who,
                               job.model_name, p.info.iteration, t, pp, engine.options().max_batch,
                               engine.options().max_kv_tokens)
                << fmt::format("{}listening on http://{}:{}", who, job.http.host, server.port()) << std::endl;
      server.run(g_stop);
      std::cerr << who << "stopped" << std::endl;
    } else {
      loom::serve::follow(engine);
    }
    groups->shutdown();
    return 0;
  } catch (const std::invalid_argument& e) {  // a flag the engine refuses (--max-batch, --bench-*)
    return fail(2, loom::cli::error_text(e));
  } catch (const std::exception& e) {
    return fail(loom::cli::input_error_status(e), loom::cli::error_text(e));
  }
}

// Every flag of `loom serve`, bound to the job (and to the two that need checking after parsing).
void add_serve_flags(CLI::App& app, ServeJob& job, int64_t& iteration, int64_t& max_body_mb) {
  app.add_option("--checkpoint", job.request.checkpoint, "run directory (holding checkpoints/) or checkpoints directory");
  app.add_option("--prompt-checkpoint", job.prompt_checkpoint,
                 "a prompt-learning run (or its prompt_tables/): requests may name its tasks "
                 "(default --checkpoint: the base it was tuned on)");
  app.add_option("--iteration", iteration, "checkpoint iteration (default: the latest)");
  app.add_option("--tensor-parallel", job.request.tensor_parallel, "tensor-parallel ranks (default: the checkpoint's)");
  app.add_option("--pipeline-parallel", job.pipeline_parallel, "pipeline stages")->capture_default_str();
  app.add_option("--host", job.http.host, "address to listen on")->capture_default_str();
  app.add_option("--port", job.http.port, "port (0: any free one, printed)")->capture_default_str();
  app.add_option("--api-key-file", job.api_key_file,
                 "require Authorization: Bearer KEY, KEY the file's first line (default: $LOOM_API_KEY, else none)");
  app.add_option("--api-key", job.http.api_key,
                 "the key itself: visible to every user in the process list (ps); prefer $LOOM_API_KEY or --api-key-file");
  app.add_option("--max-batch", job.engine.max_batch, "requests decoding together")->capture_default_str();
  app.add_option("--max-kv-tokens", job.engine.max_kv_tokens,
                 "KV-cache positions the running requests may reserve (prompt + max tokens; 0: max-batch x context)")
      ->capture_default_str();
  app.add_option("--max-body-mb", max_body_mb, "largest request body in MiB, chunked ones included (413 beyond)")
      ->capture_default_str();
  app.add_option("--header-timeout-s", job.http.header_timeout_s,
                 "a request's line and headers must arrive within this many seconds (408 beyond)")
      ->capture_default_str();
  app.add_option("--model-name", job.model_name, "the model id the API reports (default: the checkpoint folder's name)");
  app.add_option("--vocab-file", job.request.vocab_file, "GPT-2 vocab.json (default: the recipe's)");
  app.add_option("--merge-file", job.request.merge_file, "GPT-2 merges.txt (default: the recipe's)");
  app.add_option("--accelerator", job.request.accelerator, "cpu or gpu (default: the run's trainer.accelerator)");
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
  if (app.count("--iteration")) job.request.iteration = iteration;
  if (job.request.checkpoint.empty() && job.prompt_checkpoint.empty()) {
    std::cerr << "loom serve: error: --checkpoint DIR (or --prompt-checkpoint DIR) is required\n";
    return false;
  }
  if (app.count("--tensor-parallel") && job.request.tensor_parallel < 1) {
    std::cerr << "loom serve: error: --tensor-parallel: expected an integer >= 1\n";
    return false;
  }
  if (max_body_mb < 1 || max_body_mb > loom::serve::limits::kMaxBodyMiBFlag) {
    std::cerr << "loom serve: error: --max-body-mb: expected 1.." << loom::serve::limits::kMaxBodyMiBFlag
              << ", found " << max_body_mb << "\n";
    return false;
  }
  job.http.max_body_bytes = static_cast<size_t>(max_body_mb) << 20;
  if (job.http.header_timeout_s < 1 || job.http.header_timeout_s > 3600) {
    std::cerr << "loom serve: error: --header-timeout-s: expected 1..3600, found " << job.http.header_timeout_s << "\n";
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
    job.http.api_key = key;
  }
  if (job.http.api_key.empty())
    if (const char* key = std::getenv("LOOM_API_KEY")) job.http.api_key = key;
  if (job.model_name.empty()) {
    auto path = std::filesystem::absolute(job.request.checkpoint.empty() ? job.prompt_checkpoint : job.request.checkpoint)
                    .lexically_normal();
    if (path.filename().empty()) path = path.parent_path();
    job.model_name = path.filename().string();
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
    ranks = plan(job).tensor_parallel * job.pipeline_parallel;
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
