#include "serve/serve_run.h"

#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <optional>
#include <vector>

#include "convert/hf_files.h"
#include "generate/model_loader.h"
#include "model/gpt_stage.h"
#include "ptune/frozen_base.h"
#include "ptune/prompt_tables.h"
#include "runtime/rank_session.h"
#include "serve/chat_template.h"
#include "serve/prompt_requests.h"

namespace loom::serve {

namespace {

using generate::GenerateInputError;

// Collectives of a serving job: a rank that stops answering ends the server within a minute.
constexpr std::chrono::seconds kServeCollectiveTimeout{60};

// --prompt-checkpoint's tables (GenerateInputError naming the flag when they do not read).
ptune::PromptTables read_tables(const ServeRequest& request) {
  try {
    return ptune::read_prompt_tables(request.prompt_checkpoint);
  } catch (const std::invalid_argument& e) {
    throw GenerateInputError(std::string("--prompt-checkpoint: ") + e.what());
  }
}

// The checkpoint to serve: --checkpoint, else the base the tables were tuned on (the tables
// are read either way, so that bad ones are named before any rank starts).
generate::GenerateRequest checkpoint_request(const ServeRequest& request) {
  generate::GenerateRequest model = request.model;
  if (request.prompt_checkpoint.empty()) return model;
  const auto tables = read_tables(request);
  if (!model.checkpoint.empty()) return model;
  if (!tables.base.contains("checkpoints"))
    throw GenerateInputError("--prompt-checkpoint: the tables do not name their base; pass --checkpoint");
  model.checkpoint = tables.base["checkpoints"].get<std::string>();
  if (!model.iteration) model.iteration = tables.base.value("iteration", int64_t{0});
  return model;
}

// The tables on `device` for the engine, checked against the loaded base: tuned on this very
// checkpoint (its digest), vectors of the model's hidden size.
std::vector<at::Tensor> device_tables(const ptune::PromptTables& tables, const generate::FullCheckpoint& base,
                                      int64_t hidden, const c10::Device& device) {
  if (tables.base.contains("checkpoint_digest") && tables.base["checkpoint_digest"] != ptune::checkpoint_digest(base))
    throw GenerateInputError(fmt::format(
        "--prompt-checkpoint: the tables were tuned on the base with checkpoint digest {}; iteration {} of the served "
        "checkpoint is another model", tables.base["checkpoint_digest"].get<std::string>(), base.info.iteration));
  std::vector<at::Tensor> out;
  for (const auto& t : tables.tasks) {
    if (t.vectors.size(1) != hidden)
      throw GenerateInputError(fmt::format("--prompt-checkpoint: task '{}' has vectors of size {}, the model {}",
                                           t.spec.taskname, t.vectors.size(1), hidden));
    out.push_back(t.vectors.to(device));
  }
  return out;
}

// Rank 0 with HTTP: serves until `stop`, with the learned prompts' tasks when there are tables.
void serve_http(const ServeRequest& request, GenerationEngine& engine, const std::optional<ptune::PromptTables>& tables,
                const data::Tokenizer& tokenizer, const model::GptConfig& config, const ServingStarted& started,
                const std::string& chat_path, const std::atomic<bool>& stop, const ServeEvents& events) {
  std::optional<PromptTasks> tasks;
  if (tables) {
    std::vector<config::TaskTemplate> templates;
    for (const auto& task : tables->tasks) templates.push_back(task.spec);
    tasks = make_prompt_tasks(templates, tables->add_bos, tokenizer, config.max_position_embeddings);
  }
  // The chat template's bos_token and eos_token are the tokenizer's texts of its ids.
  auto token = [&tokenizer](int32_t id) { return id >= 0 ? tokenizer.decode({id}) : std::string(); };
  std::unique_ptr<ChatTemplate> chat;
  if (!chat_path.empty()) chat = read_chat_template(chat_path, token(tokenizer.bos_id()), token(tokenizer.eod_id()));
  ApiContext api{&tokenizer, config.max_position_embeddings, request.model_name, {}, tasks ? &*tasks : nullptr,
                 max_prompt_bytes(tokenizer, config.max_position_embeddings), chat.get()};
  for (const auto& m : request.lora) api.adapters.push_back(m.name);
  HttpServer server(engine, api, request.http);
  ServingStarted listening = started;
  listening.port = server.port();
  listening.chat_template = chat_path;
  if (events.listening) events.listening(listening);
  server.run(stop);
  if (events.stopped) events.stopped();
}

}  // namespace

std::string chat_template_path(const ServeRequest& request, const generate::GeneratePlan& plan) {
  if (!request.chat_template.empty()) return request.chat_template;
  const std::string own = plan.location.run_dir.empty()
                              ? std::string()
                              : plan.location.run_dir + "/tokenizer/" + convert::kHfChatTemplateFile;
  return !own.empty() && std::ifstream(own).good() ? own : std::string();
}

// --draft-checkpoint's plan (read like --checkpoint, at t = 1), checked against the served
// model's config: the same vocabulary; nullopt without one.
std::optional<generate::GeneratePlan> draft_plan(const ServeRequest& request, const model::GptConfig& served) {
  if (request.draft_checkpoint.empty()) return std::nullopt;
  generate::GenerateRequest r;
  r.checkpoint = request.draft_checkpoint;
  r.tensor_parallel = 1;
  r.vocab_file = request.model.vocab_file;
  r.merge_file = request.model.merge_file;
  r.accelerator = request.model.accelerator;
  auto plan = generate::plan_generation(r);
  const auto config = generate::inference_config(plan.info.layout.model_shape, plan.model_options);
  if (config.vocab_size != served.vocab_size)
    throw GenerateInputError(fmt::format("--draft-checkpoint {}: its vocabulary has {} tokens, the served model's {}: "
                                         "a draft model must share the tokenizer",
                                         request.draft_checkpoint, config.vocab_size, served.vocab_size));
  return plan;
}

generate::GeneratePlan plan_serving(const ServeRequest& request) {
  auto plan = generate::plan_generation(checkpoint_request(request));
  const auto config = generate::inference_config(plan.info.layout.model_shape, plan.model_options);
  if (request.pipeline_parallel < 1 || config.num_layers % request.pipeline_parallel != 0)
    throw GenerateInputError(fmt::format("--pipeline-parallel {}: expected a divisor of the model's {} layers",
                                         request.pipeline_parallel, config.num_layers));
  draft_plan(request, config);
  plan_lora_modules(request.lora, request.model_name, plan);
  try {  // the engine's flags (--max-batch, --max-kv-tokens, --max-num-batched-tokens), before any rank starts
    resolve_engine_options(request.engine, config.max_position_embeddings);
  } catch (const std::invalid_argument& e) {
    throw GenerateInputError(e.what());
  }
  if (const std::string chat = chat_template_path(request, plan); !chat.empty()) {
    try {
      read_chat_template(chat, "", "");
    } catch (const std::invalid_argument& e) {
      throw GenerateInputError(std::string(request.chat_template.empty() ? "" : "--chat-template ") + e.what());
    }
  }
  if (request.http.port < 0 || request.http.port > 65535)
    throw GenerateInputError(fmt::format("--port: expected 0..65535, found {}", request.http.port));
  return plan;
}

void serve_on_rank(const launch::RendezvousInfo& info, ServeRequest request, const std::atomic<bool>& stop,
                   const ServeEvents& events) {
  const auto plan = plan_serving(request);
  const int pp = request.pipeline_parallel;
  runtime::RankSessionRequest ranks = generate::rank_session_request(plan);
  ranks.world_size_source = "--tensor-parallel × --pipeline-parallel";
  ranks.layout.pp = pp;
  ranks.timeout = kServeCollectiveTimeout;
  const runtime::RankSession session = runtime::start_rank_session(info, ranks);
  auto& groups = *session.groups;

  const auto config = generate::inference_config(plan.info.layout.model_shape, plan.model_options);
  const auto coords = groups.coords();
  std::optional<generate::FullCheckpoint> checkpoint =
      generate::read_full_checkpoint(plan.location.checkpoints, plan.info);
  model::GptStage stage =
      generate::load_stage(*checkpoint, config, groups.tensor_ptr(),
                           model::pipeline_stage_layouts(config, pp, 1, coords.pp).front(), groups.device(),
                           coords.tp, ranks.layout.tp);
  std::optional<ptune::PromptTables> tables;
  // The served adapters: this stage's layers, sharded over its TP group (model/lora_serving.h).
  const model::ParamList params = stage.parameters();
  model::LoraBank lora(stage.layout().first_layer, stage.num_local_layers(), groups.tensor_ptr(),
                       params.front().tensor.options());
  {
    load_lora_modules(plan_lora_modules(request.lora, request.model_name, plan), *checkpoint, lora);
    if (lora.size() > 0) request.engine.lora = &lora;
    if (!request.prompt_checkpoint.empty()) {
      tables = read_tables(request);
      request.engine.prompt_tables = device_tables(*tables, *checkpoint, config.hidden_size, groups.device());
    }
    checkpoint.reset();  // the weights now live in the stage
  }
  const auto loaded_tokenizer = generate::load_tokenizer(plan);  // the run's (any library), checked
  const data::Tokenizer& tokenizer = *loaded_tokenizer;
  request.engine.eod_id = tokenizer.eod_id();
  request.engine.decode = [&tokenizer](const std::vector<int64_t>& ids) {
    return tokenizer.decode(std::vector<int32_t>(ids.begin(), ids.end()));
  };
  // The draft model, whole on every rank: each proposes the same drafts.
  std::optional<model::GptStage> draft;
  if (const auto d = draft_plan(request, config)) {
    const auto draft_config = generate::inference_config(d->info.layout.model_shape, d->model_options);
    draft.emplace(generate::load_inference_model(generate::read_full_checkpoint(d->location.checkpoints, d->info),
                                                 draft_config, runtime::Communicator::solo(), groups.device()));
    request.engine.draft_model = &*draft;
  }
  EngineGroups engine_groups{groups.tensor_ptr(), &groups.pipeline_links(), &groups.host_world(),
                             groups.layout().rank_of({0, 0, pp - 1})};
  GenerationEngine engine(stage, engine_groups, request.engine);
  if (info.rank == 0 && request.benchmark) {
    const BenchmarkResult result = run_engine_benchmark(engine, *request.benchmark, config.vocab_size);
    if (events.benchmarked) events.benchmarked(result);
  } else if (info.rank == 0) {
    const ServingStarted started{plan.info.iteration, ranks.layout, engine.options().max_batch,
                                 engine.options().max_kv_tokens, 0};
    serve_http(request, engine, tables, tokenizer, config, started, chat_template_path(request, plan), stop, events);
  } else {
    follow(engine);
  }
  groups.shutdown();
}

}  // namespace loom::serve
