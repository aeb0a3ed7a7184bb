#include "planner/inference_cli.h"

#include "launch/local_launcher.h"
#include "planner/inference_measure.h"
#include "planner/plan_flags.h"
#include "planner/text_io.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

namespace loom::planner {
namespace {

constexpr double kGiB = double(1ull << 30);

constexpr const char* kPlanInferenceHelp =
    "Plan an inference (serving) layout: search tensor size, pipeline size and batch with an analytic "
    "memory and latency model and rank the layouts that fit and meet the latency / throughput limits.";

const char* objective_name(InferenceObjective o) {
  return o == InferenceObjective::request_latency ? "request latency (ascending)"
                                                  : "tokens/s per GPU (descending)";
}

}  // namespace

std::string format_inference_table(const std::vector<InferenceCandidate>& cands, std::size_t rows) {
  std::string s = fmt::format("{:>4} {:>3} {:>3} {:>5} {:>8} {:>7} {:>9} {:>9} {:>10} {:>10} {:>12}\n", "rank",
                              "TP", "PP", "batch", "replicas", "mem GiB", "TTFT ms", "token ms", "request ms",
                              "tokens/s", "tokens/s/GPU");
  for (std::size_t i = 0; i < cands.size() && i < rows; ++i) {
    const InferenceCandidate& c = cands[i];
    const InferenceLayout& L = c.layout;
    s += fmt::format("{:>4} {:>3} {:>3} {:>5} {:>8} {:>7.1f} {:>9.1f} {:>9.2f} {:>10.1f} {:>10.0f} {:>12.1f}\n", i + 1,
                     L.parallel.tp, L.parallel.pp, L.batch, L.replicas, c.memory.terms.total() / kGiB, c.time.ttft * 1e3,
                     c.time.per_token * 1e3, c.time.request * 1e3, c.time.tokens_per_s_cluster,
                     c.time.tokens_per_s_per_gpu);
  }
  return s;
}

std::string format_inference_csv(const std::vector<InferenceCandidate>& cands) {
  using Row = InferenceCandidate;
  std::vector<CsvColumn<Row>> cols = {
      {"rank", [](const Row&, std::size_t rank) { return std::to_string(rank); }},
      csv_value<Row>("tp", [](const Row& c) { return c.layout.parallel.tp; }),
      csv_value<Row>("pp", [](const Row& c) { return c.layout.parallel.pp; }),
      csv_value<Row>("batch", [](const Row& c) { return c.layout.batch; }),
      csv_value<Row>("replicas", [](const Row& c) { return c.layout.replicas; }),
      csv_value<Row>("fits", [](const Row& c) { return c.fits ? 1 : 0; }),
      csv_value<Row>("meets_limits", [](const Row& c) { return c.meets_limits ? 1 : 0; }),
      csv_value<Row>("worst_stage", [](const Row& c) { return c.memory.stage; }),
      csv_fixed<Row>("memory_gib", 3, [](const Row& c) { return c.memory.terms.total() / kGiB; }),
      csv_fixed<Row>("weights_gib", 3, [](const Row& c) { return c.memory.terms.weights / kGiB; }),
      csv_fixed<Row>("kv_cache_gib", 3, [](const Row& c) { return c.memory.terms.kv_cache / kGiB; }),
      csv_fixed<Row>("activations_gib", 3, [](const Row& c) { return c.memory.terms.activations / kGiB; }),
      csv_fixed<Row>("reserve_gib", 3, [](const Row& c) { return c.memory.terms.reserve / kGiB; }),
      csv_value<Row>("binding_term", [](const Row& c) { return c.memory.terms.largest_term(); }),
      csv_fixed<Row>("ttft_ms", 3, [](const Row& c) { return c.time.ttft * 1e3; }),
      csv_fixed<Row>("token_ms", 4, [](const Row& c) { return c.time.per_token * 1e3; }),
      csv_fixed<Row>("request_ms", 3, [](const Row& c) { return c.time.request * 1e3; }),
      csv_fixed<Row>("tokens_per_s_replica", 2, [](const Row& c) { return c.time.tokens_per_s_replica; }),
      csv_fixed<Row>("tokens_per_s_cluster", 2, [](const Row& c) { return c.time.tokens_per_s_cluster; }),
      csv_fixed<Row>("tokens_per_s_per_gpu", 3, [](const Row& c) { return c.time.tokens_per_s_per_gpu; })};
  // Each phase's terms, prefill then decode.
  struct Term { const char* name; double PhaseCost::*field; };
  const Term terms[] = {{"gemm", &PhaseCost::gemm}, {"attention", &PhaseCost::attention},
                        {"memory_bound", &PhaseCost::memory_bound}, {"tp_comm", &PhaseCost::tp_comm},
                        {"pp_comm", &PhaseCost::pp_comm}};
  for (const auto& [phase, cost] : {std::pair{"prefill", &InferenceTime::prefill}, std::pair{"decode", &InferenceTime::decode}})
    for (const Term& term : terms)
      cols.push_back(csv_fixed<Row>(fmt::format("{}_{}_s", phase, term.name), 6,
                                    [cost = cost, f = term.field](const Row& c) { return c.time.*cost.*f; }));
  return csv_table(cols, cands);
}

namespace {

// What `loom plan infer` was asked.
struct InferArgs {
  ModelFlags model;
  HardwareFlags hw;
  int top = 10;
  std::string csv_path, precision = "bf16";
  InferenceWorkload work;
  InferenceSearchSpace space;
  std::string checkpoint;  ///< the model's shape (instead of --size ...) and what --measure serves
  int measure = 0;
  InferenceMeasureOptions mopt;
  std::string measure_csv;
};

void add_infer_flags(CLI::App& app, InferArgs& a) {
  a.model.add_to(app, "Learned positions (max prompt + output tokens)");
  a.hw.add_to(app);
  app.add_option("--prompt-tokens", a.work.prompt_tokens, "Input tokens per request")->required();
  app.add_option("--output-tokens", a.work.output_tokens, "Generated tokens per request")->required();
  app.add_option("--precision", a.precision, "bf16 or 16 (fp16): 2-byte weights and KV cache")
      ->capture_default_str();
  app.add_option("--reserve-gib", a.work.reserve_gib, "Memory reserved per GPU (context, NCCL, cuBLAS)")
      ->capture_default_str();
  app.add_option("--collective-base-us", a.work.collective_base_us,
                 "Fixed latency of one serving-size TP collective (us); measure it for your machine")
      ->capture_default_str();
  app.add_option("--collective-step-us", a.work.collective_step_us,
                 "Latency per ring step of a serving-size TP collective (us)")
      ->capture_default_str();
  app.add_option("--tp", a.space.tp, "Allowed tensor-parallel sizes (list)")->delimiter(',');
  app.add_option("--pp", a.space.pp, "Allowed pipeline sizes (list)")->delimiter(',');
  app.add_option("--batch", a.space.batch, "Allowed batch sizes per replica (list; default 1,2,4,...,1024)")
      ->delimiter(',');
  app.add_option("--max-latency-ms", a.space.max_latency_ms,
                 "Limit on the whole request: time to first token + (output - 1) per-token latencies");
  app.add_option("--max-token-latency-ms", a.space.max_token_latency_ms,
                 "Limit on the interval between generated tokens");
  app.add_option("--min-throughput", a.space.min_throughput, "Floor on generated tokens/s of the whole cluster");
  app.add_option("--top", a.top, "Rows of the terminal table")->capture_default_str();
  app.add_option("--csv", a.csv_path, "Write the ranked layouts as CSV to FILE ('-' = stdout)");
  app.add_option("--checkpoint", a.checkpoint,
                 "Plan for this Loom checkpoint's model (run or checkpoints directory; instead of --size ...)");
  app.add_option("--measure", a.measure,
                 "Serve the K best layouts of --checkpoint on this machine (one replica each, the serving "
                 "engine on local ranks) and print measured beside predicted latency and throughput");
  app.add_option("--measure-rounds", a.mopt.rounds, "Timed rounds of `batch` requests per measured layout")
      ->capture_default_str();
  app.add_option("--measure-timeout", a.mopt.timeout_s, "Seconds before a measured run is stopped (timeout)")
      ->capture_default_str();
  app.add_option("--measure-dir", a.mopt.work_dir, "Directory of the measurements")->capture_default_str();
  app.add_option("--measure-csv", a.measure_csv, "Write the measured table as CSV to FILE ('-' = stdout)");
}

// The model: the checkpoint's (--checkpoint) or the flags'. Throws std::invalid_argument when
// both or neither are given, or for bad --measure flags.
ModelShape resolve_model(const InferArgs& a) {
  if (a.measure < 0) throw std::invalid_argument(fmt::format("--measure must be >= 0, found {}", a.measure));
  if (a.measure > 0 && a.checkpoint.empty())
    throw std::invalid_argument("--measure needs --checkpoint DIR: the runs serve its model");
  if (a.mopt.rounds < 1)
    throw std::invalid_argument(fmt::format("--measure-rounds must be >= 1, found {}", a.mopt.rounds));
  if (!(a.mopt.timeout_s > 0)) throw std::invalid_argument("--measure-timeout must be > 0");
  if (a.checkpoint.empty()) return a.model.resolve();
  if (a.model.given())
    throw std::invalid_argument("give the model either by --checkpoint or by --size/--num-layers..., not both");
  return checkpoint_model_shape(a.checkpoint);
}

// --measure: serves the K best layouts one after the other, prints and writes the measured
// table. Returns 1 when no run succeeded, else 0.
int measure_best(InferArgs& a, const InferenceSearchResult& result) {
  InferenceMeasureOptions& mopt = a.mopt;
  mopt.loom_exe = launch::self_executable();
  mopt.checkpoint = a.checkpoint;
  mopt.prompt_tokens = a.work.prompt_tokens;
  mopt.output_tokens = a.work.output_tokens;
  std::vector<MeasuredInferenceLayout> rows;
  const std::size_t k = std::min(std::size_t(a.measure), result.ranked.size());
  bool any_ok = false;
  for (std::size_t i = 0; i < k; ++i) {
    const InferenceCandidate& c = result.ranked[i];
    std::fprintf(stderr, "[measure %zu/%zu] t%d p%d b%d (one replica; predicted %.1f tokens/s) ...", i + 1, k,
                 c.layout.parallel.tp, c.layout.parallel.pp, c.layout.batch, c.time.tokens_per_s_replica);
    std::fflush(stderr);
    rows.push_back({i + 1, c, measure_inference_layout(mopt, c.layout, i + 1)});
    const InferenceMeasurement& m = rows.back().measured;
    if (m.status == RunStatus::ok)
      std::fprintf(stderr, " %.1f tokens/s, TTFT %.1f ms, %.2f ms/token\n", m.tokens_per_s, m.ttft_ms, m.token_ms);
    else
      std::fprintf(stderr, " %s: %s\n", to_string(m.status), m.detail.c_str());
    any_ok = any_ok || m.status == RunStatus::ok;
  }
  std::fprintf(stderr, "\n%s", format_inference_measured_table(rows).c_str());
  if (!a.measure_csv.empty()) write_text(a.measure_csv, format_inference_measured_csv(rows));
  return any_ok ? 0 : 1;
}

// The command after parsing: resolve the device and model, check the flags, search, report.
// With --measure, serves the best layouts. Returns 1 when no layout fits and meets the limits
// (or no measured run succeeded). Throws std::invalid_argument for bad input.
int plan_inference(InferArgs& a) {
  const ModelShape shape = resolve_model(a);
  const GpuSpec gpu = a.hw.resolve_gpu();
  if (a.precision != "bf16" && a.precision != "16" && a.precision != "fp16")
    throw std::invalid_argument(fmt::format("--precision: expected bf16 or 16, found '{}'", a.precision));
  if (a.work.collective_base_us < 0 || a.work.collective_step_us < 0)
    throw std::invalid_argument("--collective-base-us and --collective-step-us must be >= 0");
  if (a.top < 0) throw std::invalid_argument(fmt::format("--top must be >= 0, found {}", a.top));
  const Cluster cluster = a.hw.cluster(gpu);

  const InferenceSearchResult result = search_inference(shape, cluster, a.work, a.space);
  std::fprintf(stderr, "loom plan infer: %s on %d x %d %s (%d GPUs, %.0f GiB), %d prompt + %d output tokens\n",
               shape.summary().c_str(), cluster.num_nodes, cluster.gpus_per_node, gpu.name.c_str(), cluster.world(),
               gpu.memory_gib, a.work.prompt_tokens, a.work.output_tokens);
  std::fprintf(stderr, "evaluated %zu layouts; %zu fit in memory; %zu meet the limits; ranked by %s\n",
               result.enumerated, result.fitting.size(), result.ranked.size(), objective_name(result.objective));
  if (result.ranked.empty()) {
    std::fprintf(stderr, "loom plan infer: %s\n", explain_no_layout(result, a.space, cluster).c_str());
    if (!a.csv_path.empty()) write_text(a.csv_path, format_inference_csv(result.ranked));
    return 1;
  }
  std::fprintf(stderr, "%s", format_inference_table(result.ranked, std::size_t(a.top)).c_str());
  if (!a.csv_path.empty()) write_text(a.csv_path, format_inference_csv(result.ranked));
  return a.measure > 0 ? measure_best(a, result) : 0;
}

}  // namespace

int run_plan_inference_command(int argc, char** argv) {
  CLI::App app{kPlanInferenceHelp};
  InferArgs args;
  add_infer_flags(app, args);
  return parse_and_run(app, argc, argv, "loom plan infer", [&] { return plan_inference(args); });
}

}  // namespace loom::planner
