#include "eval/eval_run.h"

#include <fmt/format.h>

#include <cmath>
#include <sstream>

#include "eval/eval_error.h"
#include "eval/token_requests.h"
#include "generate/model_loader.h"

namespace loom::eval {

namespace {

void at_least(int64_t value, int64_t low, const char* flag) {
  if (value < low) throw EvalInputError(fmt::format("{}: expected an integer >= {}, found {}", flag, low, value));
}

// Where a document's token requests are in the flat list: [first, first + count) per
// harness request (rolling: one request of many windows).
struct DocRequests {
  std::vector<std::pair<int64_t, int64_t>> ranges;
};

}  // namespace

EvalPlan plan_eval(const EvalRequest& request) {
  at_least(request.layout.tp, 1, "--tensor-parallel");
  at_least(request.layout.pp, 1, "--pipeline-parallel");
  at_least(request.layout.dp, 1, "--data-parallel");
  at_least(request.batch_size, 1, "--batch-size");
  at_least(request.limit, 0, "--limit");
  at_least(request.max_length, 0, "--max-length");
  at_least(request.bootstrap_iters, 0, "--bootstrap-iters");
  if (request.tasks.empty()) throw EvalInputError("give the tasks with --tasks KIND:PATH[,...] or --task-file FILE");

  generate::GenerateRequest model_request;
  model_request.checkpoint = request.checkpoint;
  model_request.iteration = request.iteration;
  model_request.tensor_parallel = request.layout.tp;
  model_request.vocab_file = request.vocab_file;
  model_request.merge_file = request.merge_file;
  model_request.accelerator = request.accelerator;
  EvalPlan plan;
  plan.model = generate::plan_generation(model_request);

  const model::GptConfig config = generate::inference_config(plan.model.info.layout.model_shape, plan.model.model_options);
  try {
    (void)model::pipeline_stage_layouts(config, request.layout.pp, 1, 0);
  } catch (const std::invalid_argument& e) {
    throw EvalInputError(fmt::format("--pipeline-parallel {} does not fit the checkpoint's model ({} layers): {}",
                                     request.layout.pp, config.num_layers, e.what()));
  }
  plan.max_length = request.max_length > 0 ? request.max_length : config.max_position_embeddings;
  if (plan.max_length > config.max_position_embeddings)
    throw EvalInputError(fmt::format("--max-length {} is more than the model's max_position_embeddings {}",
                                     plan.max_length, config.max_position_embeddings));
  for (const auto& spec : request.tasks) plan.tasks.push_back(read_task(spec, request.limit));
  return plan;
}

std::vector<TaskResult> run_eval(const EvalPlan& plan, const EvalRequest& request, runtime::ProcessGroups& groups,
                                 const ScoringProgress& progress, const std::function<void(const ScoringCost&)>& on_cost) {
  const auto& layout = groups.layout();
  if (layout.tensor_parallel() != request.layout.tp || layout.pipeline_parallel() != request.layout.pp ||
      layout.data_parallel() != request.layout.dp)
    throw std::invalid_argument(fmt::format("run_eval: the groups are t={} p={} d={}, the request t={} p={} d={}",
                                            layout.tensor_parallel(), layout.pipeline_parallel(), layout.data_parallel(),
                                            request.layout.tp, request.layout.pp, request.layout.dp));
  const model::GptConfig config = generate::inference_config(plan.model.info.layout.model_shape, plan.model.model_options);
  const std::unique_ptr<data::Tokenizer> tokenizer = generate::load_tokenizer(plan.model);
  const int64_t prefix = data::document_start_id(*tokenizer);
  if (prefix < 0)
    throw EvalInputError("the tokenizer " + tokenizer->description() +
                         " has no end-of-document (or beginning-of-sequence) token, the prefix token of empty "
                         "contexts and rolling windows");

  // The harness's token requests of every document of every task, in one list.
  std::vector<TokenRequest> requests;
  std::vector<std::vector<DocRequests>> where(plan.tasks.size());
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    const EvalTask& task = plan.tasks[t];
    const bool rolling = output_type(task.spec.kind) == "loglikelihood_rolling";
    for (const EvalDoc& doc : task.docs) {
      DocRequests dr;
      if (rolling) {
        auto windows = rolling_requests(doc.target, *tokenizer, prefix, plan.max_length);
        dr.ranges.emplace_back(static_cast<int64_t>(requests.size()), static_cast<int64_t>(windows.size()));
        for (auto& w : windows) requests.push_back(std::move(w));
      } else {
        const std::string at = fmt::format("{}:{}", task.spec.path, doc.line);
        for (const auto& r : doc.requests) {
          dr.ranges.emplace_back(static_cast<int64_t>(requests.size()), 1);
          requests.push_back(continuation_request(r.context, r.continuation, *tokenizer, prefix, plan.max_length, at));
        }
      }
      where[t].push_back(std::move(dr));
    }
  }

  if (on_cost) on_cost(scoring_cost(requests, request.batch_size, config));

  // This rank's stage of the model, from the checkpoint whatever layout wrote it.
  const runtime::RankCoords me = groups.coords();
  const model::StageChunk stage_layout =
      model::pipeline_stage_layouts(config, request.layout.pp, 1, me.pp).at(0);
  model::GptStage stage = generate::load_stage(
      generate::read_full_checkpoint(plan.model.location.checkpoints, plan.model.info), config,
      groups.tensor_ptr(), stage_layout, groups.device(), me.tp, request.layout.tp);

  const std::vector<RequestScore> scores = score_requests(stage, groups, requests, request.batch_size, progress);

  std::vector<TaskResult> out(plan.tasks.size());
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    const EvalTask& task = plan.tasks[t];
    std::vector<std::vector<RequestScore>> per_doc;
    for (size_t i = 0; i < task.docs.size(); ++i) {
      DocumentResult doc;
      for (const auto& [first, count] : where[t][i].ranges) {
        RequestScore sum{0.0, true};
        for (int64_t k = first; k < first + count; ++k) {
          sum.loglikelihood += scores[k].loglikelihood;
          sum.greedy = sum.greedy && scores[k].greedy;
          doc.tokens += requests[k].scored;
        }
        doc.windows += count;
        doc.scores.push_back(sum);
      }
      per_doc.push_back(doc.scores);
      out[t].docs.push_back(std::move(doc));
    }
    out[t].metrics = aggregate(task.spec.kind, task.docs, per_doc, request.bootstrap_iters);
  }
  return out;
}

std::vector<TaskResult> eval_on_rank(const launch::RendezvousInfo& info, const EvalPlan& plan,
                                     const EvalRequest& request, const ScoringProgress& progress,
                                     const std::function<void(const ScoringCost&)>& on_cost) {
  runtime::RankSessionRequest ranks = generate::rank_session_request(plan.model);
  ranks.layout = request.layout;
  ranks.world_size_source = "--tensor-parallel × --pipeline-parallel × --data-parallel";
  const runtime::RankSession session = runtime::start_rank_session(info, ranks);
  std::vector<TaskResult> results = run_eval(plan, request, *session.groups, progress, on_cost);
  session.groups->shutdown();
  return results;
}

nlohmann::json results_json(const EvalPlan& plan, const EvalRequest& request, const std::vector<TaskResult>& results,
                            double seconds) {
  nlohmann::json j;
  j["results"] = nlohmann::json::object();
  j["configs"] = nlohmann::json::object();
  j["higher_is_better"] = nlohmann::json::object();
  j["n-samples"] = nlohmann::json::object();
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    const EvalTask& task = plan.tasks[t];
    const std::string& name = task.spec.name;
    nlohmann::json r = {{"alias", name}};
    nlohmann::json metric_list = nlohmann::json::array(), better = nlohmann::json::object();
    for (const MetricValue& m : results[t].metrics) {
      r[m.name + ",none"] = m.value;
      r[m.name + "_stderr,none"] = m.stderr_value ? nlohmann::json(*m.stderr_value) : nlohmann::json("N/A");
      metric_list.push_back({{"metric", m.name}, {"higher_is_better", m.higher_is_better}});
      better[m.name] = m.higher_is_better;
    }
    j["results"][name] = r;
    j["higher_is_better"][name] = better;
    j["n-samples"][name] = {{"original", task.total_docs}, {"effective", static_cast<int64_t>(task.docs.size())}};
    j["configs"][name] = {{"task", name},
                          {"kind", kind_name(task.spec.kind)},
                          {"dataset_path", "json"},
                          {"dataset_kwargs", {{"data_files", task.spec.path}}},
                          {"output_type", output_type(task.spec.kind)},
                          {"target_delimiter", " "},
                          {"num_fewshot", 0},
                          {"metric_list", metric_list}};
  }
  const auto& info = plan.model.info;
  j["config"] = {{"model", "loom"},
                 {"model_args", fmt::format("checkpoint={},iteration={}", plan.model.location.checkpoints, info.iteration)},
                 {"checkpoint", plan.model.location.checkpoints},
                 {"iteration", info.iteration},
                 {"checkpoint_layout",
                  {{"tensor_parallel", info.layout.parallel.tp}, {"pipeline_parallel", info.layout.parallel.pp}}},
                 {"tensor_parallel", request.layout.tp},
                 {"pipeline_parallel", request.layout.pp},
                 {"data_parallel", request.layout.dp},
                 {"batch_size", request.batch_size},
                 {"limit", request.limit > 0 ? nlohmann::json(request.limit) : nlohmann::json(nullptr)},
                 {"bootstrap_iters", request.bootstrap_iters},
                 {"max_length", plan.max_length},
                 {"device", plan.model.accelerator ? "accelerator" : "cpu"}};
  j["total_evaluation_time_seconds"] = fmt::format("{:.3f}", seconds);
  return j;
}

std::vector<nlohmann::json> sample_records(const EvalTask& task, const TaskResult& result) {
  std::vector<nlohmann::json> out;
  const bool rolling = output_type(task.spec.kind) == "loglikelihood_rolling";
  for (size_t i = 0; i < task.docs.size(); ++i) {
    const EvalDoc& doc = task.docs[i];
    const DocumentResult& r = result.docs[i];
    nlohmann::json rec = {{"doc_id", static_cast<int64_t>(i)}, {"line", doc.line}, {"doc", doc.record}};
    nlohmann::json args = nlohmann::json::array(), resps = nlohmann::json::array();
    if (rolling) {
      rec["target"] = doc.target;
      args.push_back({doc.target});
      resps.push_back({r.scores.at(0).loglikelihood});
    } else {
      rec["target"] = output_type(task.spec.kind) == "multiple_choice" ? nlohmann::json(doc.gold) : nlohmann::json(doc.target);
      for (size_t k = 0; k < doc.requests.size(); ++k) {
        args.push_back({doc.requests[k].context, doc.requests[k].continuation});
        resps.push_back({r.scores[k].loglikelihood, r.scores[k].greedy});
      }
    }
    rec["arguments"] = args;
    rec["resps"] = resps;
    const nlohmann::json metrics = document_metrics(task.spec.kind, doc, r.scores);  // kept alive for items()
    for (const auto& [k, v] : metrics.items()) rec[k] = v;
    rec["tokens"] = r.tokens;
    rec["windows"] = r.windows;
    out.push_back(std::move(rec));
  }
  return out;
}

std::string results_table(const nlohmann::json& results) {
  std::ostringstream out;
  out << "| Tasks | n | Metric | Value | | Stderr |\n|---|---:|---|---:|---|---:|\n";
  for (const auto& [task, r] : results["results"].items()) {
    const int64_t n = results["n-samples"][task]["effective"].get<int64_t>();
    bool first = true;
    for (const auto& m : results["configs"][task]["metric_list"]) {
      const std::string name = m["metric"].get<std::string>();
      const auto& se = r[name + "_stderr,none"];
      out << fmt::format("| {} | {} | {} | {:.4f} | ± | {} |\n", first ? task : "", first ? std::to_string(n) : "",
                         name, r[name + ",none"].get<double>(),
                         se.is_number() ? fmt::format("{:.4f}", se.get<double>()) : "N/A");
      first = false;
    }
  }
  return out.str();
}

}  // namespace loom::eval
