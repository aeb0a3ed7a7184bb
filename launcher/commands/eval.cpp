// `loom eval --checkpoint DIR --tasks KIND:PATH[,...] [--task-file FILE] [--tensor-parallel t]
// [--pipeline-parallel p] [--data-parallel d] [--batch-size B] [--limit N] [--max-length N]
// [--bootstrap-iters N] [--output results.json] [--log-samples]`: scores a training checkpoint
// (saved at any layout) on tasks in lm-evaluation-harness's formats with its rules
// (eval/eval_run.h, docs/design/evaluation.md). Without launcher variables and t·p·d > 1 it
// starts t·p·d local ranks of itself. Prints the harness-style table on stdout; progress and
// errors go to stderr; --output writes the harness-shaped results JSON, --log-samples beside
// it <stem>_samples_<task>.jsonl. Exit 0 ok, 2 bad input, 1 runtime failure.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "command_registry.h"
#include "config/recipe.h"
#include "data/data_error.h"
#include "error_text.h"
#include "input_errors.h"
#include "local_ranks.h"
#include "eval/eval_error.h"
#include "eval/eval_run.h"
#include "launch/env_rendezvous.h"
#include "launch/local_launcher.h"
#include "runlog/event_file.h"
#include "runlog/progress_line.h"
#include "runlog/record_scalars.h"
#include "train/checkpoint.h"

namespace {

using loom::eval::EvalRequest;

struct EvalJob {
  EvalRequest request;
  std::string output;
  bool log_samples = false;
  std::string tensorboard_dir;  ///< --tensorboard-dir (default: the checkpoint's run directory)
  bool no_tensorboard = false;
};

// rank 0's progress line (runlog/progress_line.h): requests done, rate, elapsed and ETA; redrawn
// in place on a terminal, a plain line every 10 s (and at the end) otherwise.
class ProgressLine {
 public:
  explicit ProgressLine(int replicas)
      : detail_(replicas > 1 ? "replica 0 of " + std::to_string(replicas) : ""), line_({"loom eval:", "requests"}) {}
  void operator()(int64_t done, int64_t total) { line_.update(double(done), double(total), detail_); }

 private:
  std::string detail_;
  loom::runlog::ProgressLine line_;
};

std::string samples_path(const std::string& output, const std::string& task) {
  std::filesystem::path p(output);
  return (p.parent_path() / (p.stem().string() + "_samples_" + task + ".jsonl")).string();
}

void write_outputs(const EvalJob& job, const loom::eval::EvalPlan& plan,
                   const std::vector<loom::eval::TaskResult>& results, double seconds) {
  const nlohmann::json j = loom::eval::results_json(plan, job.request, results, seconds);
  if (!job.output.empty()) {
    std::ofstream f(job.output, std::ios::trunc);
    if (!f) throw std::runtime_error("--output " + job.output + ": cannot write the file");
    f << j.dump(2) << "\n";
    if (!f.flush()) throw std::runtime_error("--output " + job.output + ": write failed");
  }
  if (job.log_samples) {
    for (size_t t = 0; t < plan.tasks.size(); ++t) {
      const std::string path = samples_path(job.output, plan.tasks[t].spec.name);
      std::ofstream f(path, std::ios::trunc);
      if (!f) throw std::runtime_error("--log-samples: cannot write " + path);
      for (const auto& rec : loom::eval::sample_records(plan.tasks[t], results[t])) f << rec.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      if (!f.flush()) throw std::runtime_error("--log-samples: write failed: " + path);
    }
  }
  // TensorBoard: the scores at the checkpoint's iteration, in the run's own event directory
  // (docs/design/tensorboard.md), so that they show beside its training curves.
  const std::string tb = job.tensorboard_dir.empty() ? plan.model.location.run_dir : job.tensorboard_dir;
  if (!job.no_tensorboard && !tb.empty()) {
    try {
      loom::runlog::EventFileWriter(tb).add_scalars(plan.model.info.iteration, loom::runlog::eval_result_scalars(j));
    } catch (const std::runtime_error& e) {  // a read-only run directory: the results still stand
      std::cerr << "loom eval: warning: " << e.what() << " (--tensorboard-dir DIR or --no-tensorboard)\n";
    }
  }
  std::cout << loom::eval::results_table(j) << std::flush;
}

int run_rank(const EvalJob& job, const loom::launch::RendezvousInfo& info) {
  return loom::cli::run_rank_body(loom::cli::rank_prefix("eval", info), [&] {
    const auto start = std::chrono::steady_clock::now();
    const EvalRequest& request = job.request;
    const auto plan = loom::eval::plan_eval(request);
    ProgressLine progress(request.layout.dp);
    loom::eval::ScoringProgress report;
    if (info.rank == 0) report = [&progress](int64_t done, int64_t total) { progress(done, total); };
    auto cost_line = [&](const loom::eval::ScoringCost& c) {
      if (info.rank != 0) return;
      std::cerr << fmt::format("loom eval: {} requests in {} batches of up to {}: {} positions, {:.3g} TFLOP of "
                               "forward passes (docs/design/evaluation.md, \"Cost\")\n",
                               c.requests, c.batches, request.batch_size, c.positions, c.flops / 1e12);
    };
    const auto results = loom::eval::eval_on_rank(info, plan, request, report, cost_line);
    if (info.rank == 0) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      write_outputs(job, plan, results, seconds);
      std::cerr << fmt::format("loom eval: {} tasks, iteration {}, t = {}, p = {}, d = {}, {:.2f} s{}\n",
                               plan.tasks.size(), plan.model.info.iteration, request.layout.tp,
                               request.layout.pp, request.layout.dp, seconds,
                               job.output.empty() ? "" : "; results in " + job.output);
    }
    return 0;
  });
}

// What was asked, as parsed (the task specs still as written).
struct EvalArgs {
  EvalJob job;
  int64_t iteration = -1;
  std::string tasks, task_file;
};

void add_flags(CLI::App& app, EvalArgs& a) {
  EvalRequest& request = a.job.request;
  app.add_option("--checkpoint", request.checkpoint, "run directory (holding checkpoints/) or checkpoints directory")
      ->required();
  app.add_option("--tasks", a.tasks,
                 "comma-separated KIND:PATH or NAME=KIND:PATH; kinds: lambada, mc, hellaswag, piqa, arc, wikitext, "
                 "rolling (JSONL files, docs/design/evaluation.md)");
  app.add_option("--task-file", a.task_file, "a file of task specs, one per line (paths relative to the file)");
  app.add_option("--tensor-parallel", request.layout.tp, "tensor-parallel ranks")->capture_default_str();
  app.add_option("--pipeline-parallel", request.layout.pp, "pipeline stages")->capture_default_str();
  app.add_option("--data-parallel", request.layout.dp, "data-parallel replicas (split the requests)")
      ->capture_default_str();
  app.add_option("--batch-size", request.batch_size, "requests per forward pass")->capture_default_str();
  app.add_option("--limit", request.limit, "only the first N documents of each task (0: all)")->capture_default_str();
  app.add_option("--max-length", request.max_length,
                 "context window in tokens (default: the model's max_position_embeddings, as the harness's hf model)");
  app.add_option("--bootstrap-iters", request.bootstrap_iters,
                 "bootstrap draws for the perplexity stderr (the harness's default; 0: no stderr)")
      ->capture_default_str();
  app.add_option("--output", a.job.output, "write the results JSON (lm-evaluation-harness's layout) here");
  app.add_flag("--log-samples", a.job.log_samples,
               "also write each task's per-document log-likelihoods to <output stem>_samples_<task>.jsonl");
  app.add_option("--tensorboard-dir", a.job.tensorboard_dir,
                 "write the scores as TensorBoard scalars (eval/<task>/<metric>) here (default: the checkpoint's run "
                 "directory)");
  app.add_flag("--no-tensorboard", a.job.no_tensorboard, "write no TensorBoard event file");
  app.add_option("--iteration", a.iteration, "checkpoint iteration (default: the latest)");
  app.add_option("--vocab-file", request.vocab_file, "GPT-2 vocab.json instead of the run's tokenizer");
  app.add_option("--merge-file", request.merge_file, "GPT-2 merges.txt instead of the run's tokenizer");
  app.add_option("--accelerator", request.accelerator, "cpu or gpu (default: the run's trainer.accelerator)");
}

// The task specs into the request. Throws EvalInputError (or the task file's error).
void read_tasks(EvalArgs& a) {
  EvalRequest& request = a.job.request;
  if (a.tasks.empty() && a.task_file.empty())
    throw loom::eval::EvalInputError("give the tasks with --tasks KIND:PATH[,...] or --task-file FILE");
  if (!a.tasks.empty()) request.tasks = loom::eval::parse_task_specs(a.tasks, "--tasks");
  if (!a.task_file.empty())
    for (auto& spec : loom::eval::read_task_file(a.task_file)) request.tasks.push_back(spec);
  if (a.job.log_samples && a.job.output.empty())
    throw loom::eval::EvalInputError("--log-samples needs --output FILE (the samples go beside it)");
}

int eval_command(int argc, char** argv) {
  CLI::App app{"Score a training checkpoint on lm-evaluation-harness tasks (LAMBADA, multiple choice, "
               "rolling log-likelihood) from local files, under any tensor/pipeline/data-parallel layout."};
  EvalArgs a;
  add_flags(app, a);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  EvalRequest& request = a.job.request;
  if (app.count("--iteration") > 0) request.iteration = a.iteration;
  try {
    read_tasks(a);
  } catch (const std::exception& e) {
    std::cerr << "loom eval: error: " << loom::cli::error_text(e) << "\n";
    return 2;
  }

  loom::launch::RendezvousInfo info;
  try {
    info = loom::launch::rendezvous_from_env();
  } catch (const std::exception& e) {
    std::cerr << "loom eval: " << loom::cli::error_text(e) << "\n";
    return 2;
  }
  if (info.source != loom::launch::RendezvousSource::kSingleProcess) return run_rank(a.job, info);

  // One process: check everything here (tasks, checkpoint, layout), then run in place or start the ranks.
  try {
    (void)loom::eval::plan_eval(request);
  } catch (const std::exception& e) {
    std::cerr << "loom eval: error: " << loom::cli::error_text(e) << "\n";
    return 2;
  }
  const int world = request.layout.tp * request.layout.pp * request.layout.dp;
  // stdout is the table (rank 0 only)
  return world == 1 ? run_rank(a.job, info) : loom::cli::run_local_ranks_for_output("eval", argc, argv, world);
}

}  // namespace

LOOM_REGISTER_COMMAND("eval", "score a checkpoint on lm-evaluation-harness tasks (LAMBADA, multiple choice, WikiText)",
                      eval_command);
