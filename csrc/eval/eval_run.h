// `loom eval` end to end, minus the command line and process spawning
// (docs/design/evaluation.md): plan_eval checks everything before any rank starts (the
// checkpoint, the tokenizer, the layout against the model, every task file); run_eval, on
// every rank of a t × p × d world, builds this rank's stage of the model from the checkpoint
// (any layout it was saved at), turns the tasks' documents into the harness's token requests,
// scores them (scorer.h) and aggregates the harness's metrics; results_json lays them out as
// lm-evaluation-harness's results file. eval_on_rank is one rank of `loom eval`, started by
// runtime::start_rank_session (docs/architecture.md, "One rank session").
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "eval/metrics.h"
#include "eval/scorer.h"
#include "eval/task_docs.h"
#include "generate/generate_run.h"
#include "launch/env_rendezvous.h"
#include "rules/layout.h"
#include "runtime/process_groups.h"

namespace loom::eval {

struct EvalRequest {
  std::string checkpoint;            ///< --checkpoint: run directory or checkpoints directory
  std::optional<int64_t> iteration;  ///< --iteration (default: the latest)
  std::vector<TaskSpec> tasks;       ///< --tasks and --task-file
  /// --tensor-parallel, --pipeline-parallel, --data-parallel: t, p and d (rules/layout.h; the
  /// layout's other fields are not read).
  Layout layout;
  int64_t batch_size = 8;            ///< --batch-size: requests per forward pass
  int64_t limit = 0;                 ///< --limit: first N documents of each task (0: all)
  int64_t max_length = 0;            ///< --max-length (0: the model's max_position_embeddings)
  int64_t bootstrap_iters = 100000;  ///< --bootstrap-iters (the harness's default; 0: no stderr)
  std::string vocab_file, merge_file;  ///< default: the run's recipe
  std::string accelerator;             ///< cpu | gpu (default: the run's recipe, else cpu)
};

struct EvalPlan {
  generate::GeneratePlan model;  ///< checkpoint, tokenizer files, model options, device kind
  std::vector<EvalTask> tasks;
  int64_t max_length = 0;
};

/// Throws EvalInputError (or train::CheckpointError / generate::GenerateInputError) naming
/// the flag, file or field: sizes < 1, a layout the model does not allow (heads, FFN or
/// layers not divisible), a missing checkpoint or tokenizer, a bad task file.
EvalPlan plan_eval(const EvalRequest& request);

/// One document's outcome, for --log-samples.
struct DocumentResult {
  std::vector<RequestScore> scores;  ///< one per request (rolling: the sum over the windows)
  int64_t tokens = 0;                ///< tokens scored
  int64_t windows = 0;               ///< rolling windows (others: requests)
};

struct TaskResult {
  std::vector<MetricValue> metrics;
  std::vector<DocumentResult> docs;
};

/// Collective over `groups` (world = t·p·d of the plan's request): every rank returns every
/// task's results. `progress` is called on every rank as its batches complete.
/// `on_cost` is called on every rank once the requests are built, before any scoring.
std::vector<TaskResult> run_eval(const EvalPlan& plan, const EvalRequest& request, runtime::ProcessGroups& groups,
                                 const ScoringProgress& progress = {},
                                 const std::function<void(const ScoringCost&)>& on_cost = {});

/// One rank of `loom eval` (collective over the job's ranks, every one with the same plan and
/// request): starts the rank (runtime::start_rank_session: std::invalid_argument unless the
/// world is t·p·d ranks of the request; the plan's device), runs run_eval with `progress` and
/// `on_cost` and shuts the groups down. Every rank returns every task's results.
std::vector<TaskResult> eval_on_rank(const launch::RendezvousInfo& info, const EvalPlan& plan,
                                     const EvalRequest& request, const ScoringProgress& progress = {},
                                     const std::function<void(const ScoringCost&)>& on_cost = {});

/// lm-evaluation-harness's results layout: {"results": {task: {"alias", "METRIC,none",
/// "METRIC_stderr,none" (a number or "N/A")}}, "configs", "higher_is_better", "n-samples",
/// "config" (checkpoint, iteration, layout, batch size, limit, bootstrap_iters, max length)}.
nlohmann::json results_json(const EvalPlan& plan, const EvalRequest& request, const std::vector<TaskResult>& results,
                            double seconds);

/// The harness's per-sample records of one task (samples_<task>.jsonl lines): doc_id, doc,
/// target, arguments, resps ([ll, is_greedy] per request; rolling: [ll]), the document's
/// metrics, and Loom's token and window counts.
std::vector<nlohmann::json> sample_records(const EvalTask& task, const TaskResult& result);

/// A Markdown table like the harness prints: | Tasks | Metric | Value | ± | Stderr |.
std::string results_table(const nlohmann::json& results);

}  // namespace loom::eval
