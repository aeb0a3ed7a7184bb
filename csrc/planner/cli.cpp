#include "planner/cli.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <set>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "config/recipe.h"
#include "launch/local_launcher.h"
#include "planner/measure.h"
#include "planner/measure_report.h"
#include "planner/memory_validation.h"
#include "planner/plan_flags.h"
#include "planner/recipe_input.h"
#include "planner/report.h"
#include "planner/search.h"
#include "planner/text_io.h"
#include "planner/validation.h"

namespace loom::planner {
namespace {

std::vector<int> parse_switches(const std::vector<std::string>& values, const char* flag) {
  std::vector<int> out;
  for (const auto& v : values) {
    const std::string x = lower(v);
    if (x == "on" || x == "true" || x == "1" || x == "yes") out.push_back(1);
    else if (x == "off" || x == "false" || x == "0" || x == "no") out.push_back(0);
    else throw std::invalid_argument(fmt::format("{}: expected on/off, found '{}'", flag, v));
  }
  return out;
}

std::vector<RecomputeGranularity> parse_recompute(const std::vector<std::string>& values) {
  std::vector<RecomputeGranularity> out;
  for (const auto& v : values) {
    const std::string x = lower(v);
    if (x == "none" || x == "null") out.push_back(RecomputeGranularity::kNone);
    else if (x == "selective") out.push_back(RecomputeGranularity::kSelective);
    else if (x == "full") out.push_back(RecomputeGranularity::kFull);
    else throw std::invalid_argument(fmt::format("--recompute: expected none, selective or full, found '{}'", v));
  }
  return out;
}

std::vector<RecomputeMethod> parse_methods(const std::vector<std::string>& values) {
  std::vector<RecomputeMethod> out;
  for (const auto& v : values) {
    const std::string x = lower(v);
    if (x == "uniform") out.push_back(RecomputeMethod::kUniform);
    else if (x == "block") out.push_back(RecomputeMethod::kBlock);
    else throw std::invalid_argument(fmt::format("--recompute-method: expected uniform or block, found '{}'", v));
  }
  return out;
}

// Flags of the search and the report, by name: list entries and counts that cannot describe a
// layout (--tp 0) or a table (--keep 0, --top -1), and negative budgets.
void check_search_flags(const std::vector<std::pair<const char*, std::vector<int>>>& sizes,
                        const std::vector<int>& recompute_layers, int top, long long keep, double tokens,
                        double price) {
  for (const auto& [flag, values] : sizes)
    for (int v : values)
      if (v < 1) throw std::invalid_argument(fmt::format("{}: expected sizes >= 1, found {}", flag, v));
  for (int v : recompute_layers)
    if (v < 0) throw std::invalid_argument(fmt::format("--recompute-layers: expected counts >= 0, found {}", v));
  if (top < 0) throw std::invalid_argument(fmt::format("--top: expected an integer >= 0, found {}", top));
  if (keep < 1) throw std::invalid_argument(fmt::format("--keep: expected an integer >= 1, found {}", keep));
  if (!(tokens >= 0)) throw std::invalid_argument(fmt::format("--tokens: expected a number >= 0, found {}", tokens));
  if (!(price >= 0)) throw std::invalid_argument(fmt::format("--price: expected a number >= 0, found {}", price));
}

// "measured.ranks" of a profile written by `loom plan calibrate` (0 when absent).
int measured_ranks(const std::string& profile_json) {
  const auto doc = nlohmann::json::parse(profile_json, nullptr, false);
  if (!doc.is_object() || !doc.contains("measured") || !doc["measured"].is_object()) return 0;
  const auto& m = doc["measured"];
  return m.contains("ranks") && m["ranks"].is_number_integer() ? m["ranks"].get<int>() : 0;
}

constexpr const char* kPlanHelp =
    "Plan a training layout: search every TP/PP/VP/DP/micro-batch/SP/recompute/optimizer layout "
    "with an analytic memory and speed model and rank those that fit by predicted step time.";

// What `loom plan` was asked: the flags as given, before any file is read. `given` records
// which flags the user set, because a --recipe supplies the others.
struct PlanArgs {
  ModelFlags model;
  HardwareFlags hw;
  int top = 10;
  long long keep = 200;
  std::string csv_path, recipe_out, precision = "bf16";
  double tokens = 0, price = 0;
  bool explain = false, validate = false, validate_memory = false;
  std::string memory_cases = "all";
  TrainingSetup setup;
  std::vector<int> tp, pp, vp, mbs, layers;
  std::vector<std::string> sp, recompute, method, dopt, uneven;
  std::string base_recipe;
  std::vector<std::string> recipe_overrides;
  int measure = 0;
  MeasureOptions mopt;
  std::string measure_pick = "top", measure_csv;
  int measure_repeats = 1;
  std::set<std::string> given;  // the long names of the flags the user set ("--gpu")
  bool was_given(const std::string& flag) const { return given.count(flag) > 0; }
};

// The base recipe (--recipe), loaded with its overrides, and what the planner reads from it.
struct BaseRecipe {
  config::Recipe recipe;
  RecipePlanInput input;
};

// One planning problem, fully resolved: the search runs on it, the report describes it.
struct PlanRequest {
  PlanContext ctx;
  GpuSpec gpu;
  SearchSpace space;
  std::size_t keep = 0;      ///< layouts the search keeps
  std::size_t csv_rows = 0;  ///< rows of the CSV (--keep, even when the search keeps more)
};

void add_model_and_search_flags(CLI::App& app, PlanArgs& a) {
  app.add_option("--recipe", a.base_recipe,
                 "Plan for a recipe's model, batch, precision and cluster (explicit flags win); its own "
                 "layout is ranked too, and --write-recipe/--measure apply layouts to it");
  app.add_option("overrides", a.recipe_overrides, "Dotted overrides of --recipe, e.g. model.global_batch_size=16");
  a.model.add_to(app, "Sequence length s");
  a.hw.add_to(app);
  app.add_option("--global-batch-size", a.setup.global_batch, "Global batch (samples per step)");
  app.add_option("--tokens", a.tokens, "Token budget, e.g. 300e9 (adds a days column)");
  app.add_option("--price", a.price, "Price per GPU-hour (adds a cost column; needs --tokens)");
  app.add_option("--precision", a.precision, "bf16, 16 (fp16) or 32 (fp32, CPU ranks)")->capture_default_str();
  app.add_option("--reserve-gib", a.setup.reserve_gib, "Memory reserved per GPU (context, NCCL, cuBLAS)")
      ->capture_default_str();
  app.add_option("--fragmentation", a.setup.fragmentation_fraction, "Fraction of memory kept for fragmentation")
      ->capture_default_str();
  app.add_flag("--flash-attention", a.setup.fused_attention,
               "Model the fused attention core (model.use_flash_attention; a recipe's field sets it too)");
  app.add_flag("--overlap-tp-comm", a.setup.overlap_tp_comm,
               "Model TP collectives overlapped with their GEMMs under SP (Megatron-Core's --tp-comm-overlap)");
  app.add_flag("--overlap-dp-comm", a.setup.overlap_dp_comm,
               "Model DP gradient reduction overlapped with the last backward");
  app.add_flag("--overlap-param-gather", a.setup.overlap_param_gather,
               "Model the distributed optimizer's parameter all-gather overlapped with the first forward "
               "(Megatron-Core's --overlap-param-gather)");
  app.add_option("--tp", a.tp, "Allowed tensor-parallel sizes (list)")->delimiter(',');
  app.add_option("--pp", a.pp, "Allowed pipeline sizes (list)")->delimiter(',');
  app.add_option("--vp", a.vp, "Allowed virtual stages per pipeline rank (list; 1 = no interleaving)")
      ->delimiter(',');
  app.add_option("--mbs", a.mbs, "Allowed micro-batch sizes (list)")->delimiter(',');
  app.add_option("--sp", a.sp, "Sequence parallelism: on, off or on,off")->delimiter(',');
  app.add_option("--recompute", a.recompute, "Recompute granularity: none, selective, full (list)")
      ->delimiter(',');
  app.add_option("--recompute-method", a.method, "Full recompute method: uniform, block (list)")->delimiter(',');
  app.add_option("--recompute-layers", a.layers, "activations_checkpoint_num_layers values (list)")
      ->delimiter(',');
  app.add_option("--dist-opt", a.dopt, "Distributed optimizer: on, off or on,off")->delimiter(',');
  app.add_option("--uneven-stages", a.uneven,
                 "Uneven pipeline stages (lighter first/last stage): on, off or on,off (default both)")
      ->delimiter(',');
}

void add_output_and_measure_flags(CLI::App& app, PlanArgs& a) {
  app.add_option("--top", a.top, "Rows of the terminal table")->capture_default_str();
  app.add_option("--keep", a.keep, "Layouts kept for the table and CSV")->capture_default_str();
  app.add_option("--csv", a.csv_path, "Write the ranked layouts as CSV to FILE ('-' = stdout)");
  app.add_option("--write-recipe", a.recipe_out, "Write the best layout as a recipe YAML to FILE ('-' = stdout)");
  app.add_flag("--explain", a.explain, "Explain why the winner wins and which memory term binds");
  app.add_option("--measure", a.measure,
                 "Train K layouts for a few steps through the launcher on this machine (needs --recipe) "
                 "and re-rank them by measured step time");
  app.add_option("--measure-pick", a.measure_pick,
                 "Which K: 'top' (the K fastest predicted) or 'spread' (the best, the worst and layouts "
                 "evenly spaced in predicted step time between them: a check of the model's ordering)")
      ->capture_default_str();
  app.add_option("--measure-steps", a.mopt.steps, "Optimizer steps per measured run")->capture_default_str();
  app.add_option("--measure-skip", a.mopt.skip_steps, "First steps left out of the mean")->capture_default_str();
  app.add_option("--measure-timeout", a.mopt.timeout_s, "Seconds before a run is stopped (classified timeout)")
      ->capture_default_str();
  app.add_option("--measure-repeats", a.measure_repeats,
                 "Runs per layout, round-robin; each keeps its fastest and the spread of its runs is shown")
      ->capture_default_str();
  app.add_option("--measure-dir", a.mopt.work_dir, "Directory of the measured runs")->capture_default_str();
  app.add_option("--measure-csv", a.measure_csv, "Write the measured table as CSV to FILE ('-' = stdout)");
  app.add_flag("--validate", a.validate,
               "Reproduce the published A100 results (Korthikanti 2022, Narayanan 2021) and exit");
  app.add_flag("--validate-memory", a.validate_memory,
               "Check the memory model: train --recipe's model a few steps over a matrix of layouts and "
               "settings on the accelerator (the stand-in device through LOOM_DEVICE_PLUGIN, or CUDA), print "
               "predicted beside measured peak and after-step memory per stage, and exit (1: off target)");
  app.add_option("--validate-memory-cases", a.memory_cases,
                 "Which --validate-memory cases: all, ci (the CI subset), one-rank or a comma list of case names")
      ->capture_default_str();
}

void record_given_flags(const CLI::App& app, PlanArgs& a) {
  for (const CLI::Option* option : app.get_options()) {
    if (option->count() > 0) a.given.insert(option->get_name());
  }
}

// Loads --recipe (when given); its cluster.gpu stands in for an absent --gpu. Throws
// std::invalid_argument for an invalid recipe, CPU ranks without --profile, or overrides
// without --recipe.
BaseRecipe load_base_recipe(PlanArgs& a) {
  BaseRecipe base;
  if (a.base_recipe.empty()) {
    if (!a.recipe_overrides.empty())
      throw std::invalid_argument(fmt::format("unexpected argument '{}' (overrides need --recipe FILE)",
                                              a.recipe_overrides.front()));
    return base;
  }
  try {
    base.recipe = config::load_recipe(a.base_recipe, a.recipe_overrides);
  } catch (const config::RecipeError& e) {
    throw std::invalid_argument(fmt::format("--recipe {}: invalid recipe:\n{}", a.base_recipe, e.what()));
  }
  // --vocab-size (V as trained) spares reading the tokenizer, which may be elsewhere.
  base.input = plan_input_from_recipe(base.recipe, a.was_given("--vocab-size")
                                                       ? std::optional<int64_t>(a.model.shape.vocab_size)
                                                       : std::nullopt);
  if (!a.was_given("--gpu") && !base.input.gpu.empty()) a.hw.gpu_name = base.input.gpu;
  if (base.input.cpu && a.hw.profile.empty())
    throw std::invalid_argument(fmt::format(
        "--recipe {} trains on CPU ranks, which have no built-in profile: measure them with "
        "`loom plan calibrate --devices {} --out cpu.json` and pass --profile cpu.json",
        a.base_recipe, base.input.devices));
  return base;
}

void check_measure_flags(const PlanArgs& a) {
  if (a.measure < 0) throw std::invalid_argument(fmt::format("--measure must be >= 0, found {}", a.measure));
  if (a.measure > 0 && a.base_recipe.empty())
    throw std::invalid_argument("--measure needs --recipe FILE: the runs train its model on its data");
  if (a.measure_pick != "top" && a.measure_pick != "spread")
    throw std::invalid_argument(fmt::format("--measure-pick: expected top or spread, found '{}'", a.measure_pick));
  const MeasureOptions& m = a.mopt;
  if (m.steps < 1 || m.skip_steps < 0 || m.skip_steps >= m.steps)
    throw std::invalid_argument(fmt::format(
        "--measure-steps {} and --measure-skip {}: need steps >= 1 and 0 <= skip < steps", m.steps, m.skip_steps));
  if (!(m.timeout_s > 0)) throw std::invalid_argument("--measure-timeout must be > 0");
  if (a.measure_repeats < 1)
    throw std::invalid_argument(fmt::format("--measure-repeats must be >= 1, found {}", a.measure_repeats));
}

// The model shape, batch, precision and cluster size of a --recipe plan (explicit flags win),
// into `a`. Throws std::invalid_argument when the model is also given by flags or --measure
// asks for a cluster other than the recipe's.
ModelShape shape_from_recipe(PlanArgs& a, const RecipePlanInput& in) {
  if (a.model.given())
    throw std::invalid_argument("give the model either by --recipe or by --size/--num-layers..., not both");
  ModelShape shape = in.shape;
  if (a.was_given("--seq-length")) shape.seq_length = a.model.shape.seq_length;
  if (a.was_given("--vocab-size")) {  // --vocab-size is V as trained (padded)
    shape.vocab_size = a.model.shape.vocab_size;
    shape.make_vocab_size_divisible_by = 1;
  }
  if (!a.was_given("--global-batch-size")) a.setup.global_batch = in.setup.global_batch;
  if (!a.was_given("--precision")) a.setup.precision = in.setup.precision;
  a.setup.fused_attention = a.setup.fused_attention || in.setup.fused_attention;  // model.use_flash_attention
  a.setup.attention_dropout = in.setup.attention_dropout;
  // --overlap-dp-comm, or what the recipe trains with (model.optim.overlap_grad_sync).
  a.setup.overlap_dp_comm = a.setup.overlap_dp_comm || in.setup.overlap_dp_comm;
  a.setup.overlap_param_gather = a.setup.overlap_param_gather || in.setup.overlap_param_gather;
  if (a.setup.dp_bucket_params == 0) a.setup.dp_bucket_params = in.setup.dp_bucket_params;
  if (!a.was_given("--nodes")) a.hw.nodes = in.num_nodes;
  if (!a.was_given("--gpus-per-node")) a.hw.gpus_per_node = in.devices;
  if (a.measure > 0 && (a.hw.nodes != 1 || a.hw.gpus_per_node != in.devices))
    throw std::invalid_argument(fmt::format(
        "--measure runs the layouts on this machine with the recipe's ranks: plan for 1 node of "
        "trainer.devices = {} (found --nodes {} --gpus-per-node {}); change trainer.devices instead",
        in.devices, a.hw.nodes, a.hw.gpus_per_node));
  // CPU ranks have no CUDA context, NCCL or cuBLAS workspaces to reserve memory for.
  if (in.cpu && !a.was_given("--reserve-gib")) a.setup.reserve_gib = 0.5;
  if (in.cpu && !a.was_given("--fragmentation")) a.setup.fragmentation_fraction = 0;
  shape.validate();
  return shape;
}

Precision parse_precision(const std::string& precision) {
  if (precision == "bf16") return Precision::kBf16;
  if (precision == "16" || precision == "fp16") return Precision::kFp16;
  if (precision == "32" || precision == "fp32") return Precision::kFp32;
  throw std::invalid_argument(fmt::format("--precision: expected bf16, 16 or 32, found '{}'", precision));
}

SearchSpace search_space(const PlanArgs& a) {
  SearchSpace space;
  space.tp = a.tp;
  space.pp = a.pp;
  space.vp = a.vp;
  space.micro_batch = a.mbs;
  space.sequence_parallel = parse_switches(a.sp, "--sp");
  space.recompute = parse_recompute(a.recompute);
  space.method = parse_methods(a.method);
  space.recompute_layers = a.layers;
  space.distributed_optimizer = parse_switches(a.dopt, "--dist-opt");
  space.uneven_stages = parse_switches(a.uneven, "--uneven-stages");
  return space;
}

// Everything after the GPU is known: shape, precision, batch, cluster and search space.
// Throws std::invalid_argument naming the flag.
PlanRequest resolve_request(PlanArgs& a, const RecipePlanInput& in, const GpuSpec& gpu, int profile_ranks) {
  PlanRequest req;
  req.gpu = gpu;
  const ModelShape shape = a.base_recipe.empty() ? a.model.resolve() : shape_from_recipe(a, in);
  if (a.base_recipe.empty() || a.was_given("--precision")) a.setup.precision = parse_precision(a.precision);
  if (a.setup.global_batch <= 0)
    throw std::invalid_argument("--global-batch-size is required (or --recipe with model.global_batch_size)");
  if (a.price > 0 && a.tokens <= 0) throw std::invalid_argument("--price needs --tokens (the token budget)");
  req.ctx.shape = shape;
  req.ctx.cluster = a.hw.cluster(gpu);
  req.ctx.setup = a.setup;
  const int planned = req.ctx.cluster.gpus_per_node;
  if (profile_ranks > 0 && in.cpu && profile_ranks != planned)
    std::fprintf(stderr,
                 "loom plan: warning: %s was measured with %d ranks sharing this node but %d ranks are "
                 "planned; CPU ranks share cores and memory, so calibrate with --devices %d\n",
                 a.hw.profile.c_str(), profile_ranks, planned, planned);
  req.ctx.token_budget = a.tokens;
  req.ctx.price_per_gpu_hour = a.price;
  req.space = search_space(a);
  // Spreading the measured runs over the whole ranking needs the whole ranking.
  req.keep = static_cast<std::size_t>(a.keep);
  req.csv_rows = req.keep;  // --keep still bounds the CSV
  if (a.measure > 0 && a.measure_pick == "spread") req.keep = std::max<std::size_t>(req.keep, 1000000);
  return req;
}

// Prints the search's summary, ranking and (asked) explanation on stderr and writes --csv.
// Returns 1 when no layout is valid or none fits, else 0.
int report_search(const PlanArgs& a, const PlanRequest& req, const SearchResult& result, const RecipePlanInput& in) {
  const PlanContext& ctx = req.ctx;
  std::fprintf(stderr, "loom plan: %s on %d x %d %s (%d %s, %.0f GiB), global batch %d\n",
               ctx.shape.summary().c_str(), ctx.cluster.num_nodes, ctx.cluster.gpus_per_node, req.gpu.name.c_str(),
               ctx.cluster.world(), in.cpu ? "CPU ranks" : "GPUs", req.gpu.memory_gib, ctx.setup.global_batch);
  std::fprintf(stderr, "searched %zu valid layouts in %.3f s; %zu fit in memory\n", result.enumerated,
               result.seconds, result.fitting);
  if (result.enumerated == 0) {
    std::fprintf(stderr,
                 "loom plan: no valid layout: every combination of the allowed --tp/--pp/--vp/--mbs/--sp/"
                 "--recompute values breaks a divisibility rule (t | heads, hidden, ffn and the %d devices; "
                 "p | layers (or an uneven split of them); d·b | global batch %d; interleaving needs micro-batches %% p == 0)\n",
                 ctx.cluster.world(), ctx.setup.global_batch);
    return 1;
  }
  if (result.best.empty()) {
    std::fprintf(stderr, "%s", explain(ctx, result).c_str());
    if (!a.csv_path.empty()) write_text(a.csv_path, format_csv(ctx, result.best_unfit));
    std::fprintf(stderr, "loom plan: no layout fits in %.1f GiB per GPU\n", req.gpu.memory_gib);
    return 1;
  }
  std::fprintf(stderr, "%s", format_table(ctx, result.best, std::size_t(std::max(a.top, 0))).c_str());
  std::fprintf(stderr, "\n%s", format_stage_memory(ctx, result.best.front().layout).c_str());
  if (!a.base_recipe.empty()) std::fprintf(stderr, "%s", describe_recipe_layout(ctx, result, in.layout).c_str());
  if (a.explain) std::fprintf(stderr, "\n%s", explain(ctx, result).c_str());
  if (!a.csv_path.empty()) {
    const std::vector<Candidate> rows(result.best.begin(),
                                      result.best.begin() + std::min(result.best.size(), req.csv_rows));
    write_text(a.csv_path, format_csv(ctx, rows));
  }
  return 0;
}

// --measure: trains the picked layouts (--measure-repeats rounds), prints and writes the
// measured table, and returns them ranked by measured step time.
std::vector<MeasuredLayout> measure_picks(PlanArgs& a, const config::Recipe& recipe, const SearchResult& result) {
  MeasureOptions& mopt = a.mopt;
  mopt.loom_exe = launch::self_executable();
  mopt.recipe_path = a.base_recipe;
  mopt.overrides = a.recipe_overrides;
  std::vector<double> predicted;
  for (const auto& c : result.best) predicted.push_back(c.step_seconds());
  const auto picks = pick_for_measurement(predicted, std::size_t(a.measure), a.measure_pick == "spread");
  std::vector<MeasuredLayout> rows;
  for (std::size_t i = 0; i < picks.size(); ++i) rows.push_back({picks[i] + 1, result.best[picks[i]], {}});
  // Repeats go round-robin, so slow drifts of a shared machine touch every layout alike;
  // each layout keeps its fastest run (the least disturbed one).
  for (int round = 0; round < a.measure_repeats; ++round) {
    for (std::size_t i = 0; i < rows.size(); ++i) {
      MeasuredLayout& row = rows[i];
      std::fprintf(stderr, "[measure %zu/%zu%s] %s (predicted %.3f s/step) ...", i + 1, rows.size(),
                   a.measure_repeats > 1 ? fmt::format(", round {}/{}", round + 1, a.measure_repeats).c_str() : "",
                   row.candidate.layout.describe().c_str(), row.candidate.step_seconds());
      std::fflush(stderr);
      const Measurement m = measure_layout(mopt, recipe, row.candidate.layout, int(row.predicted_rank));
      std::fprintf(stderr, " %s\n", describe_measurement(m).c_str());
      row.measured = round == 0 ? m : keep_fastest(row.measured, m);
    }
  }
  rank_by_measurement(rows);
  std::fprintf(stderr, "\n%s", format_measured_table(rows, mopt).c_str());
  if (!a.measure_csv.empty()) write_text(a.measure_csv, format_measured_csv(rows));
  return rows;
}

// Without --recipe: a recipe of the planned shape with the best layout, to --write-recipe or
// (not given) shown on stderr.
int write_planned_recipe(const PlanArgs& a, const PlanRequest& req, const Candidate& best) {
  const std::string yaml = recipe_yaml(req.ctx, best);
  if (!a.recipe_out.empty()) write_text(a.recipe_out, yaml);
  else std::fprintf(stderr, "\n%s", yaml.c_str());
  return 0;
}

// With --recipe: the base recipe with the chosen layout's overrides (under --measure the
// fastest measured run, else the predicted best) to --write-recipe. Returns 1 when --measure
// had no successful run, else 0.
int write_recipe_with_layout(PlanArgs& a, const BaseRecipe& base, const SearchResult& result) {
  Layout winner = result.best.front().layout;
  bool measured_ok = false;
  if (a.measure > 0) {
    const std::vector<MeasuredLayout> rows = measure_picks(a, base.recipe, result);
    measured_ok = rows.front().measured.status == RunStatus::ok;
    if (measured_ok) winner = rows.front().candidate.layout;
    else std::fprintf(stderr, "loom plan: no measured run succeeded (see the status column)\n");
  }
  auto overrides = a.recipe_overrides;
  for (const auto& o : layout_overrides(winner, base.recipe)) overrides.push_back(o);
  const char* how = a.measure == 0 ? ""
                    : measured_ok  ? " (fastest measured run)"
                                   : " (predicted best; no measured run succeeded)";
  const std::string yaml = "# Layout chosen by `loom plan`" + std::string(how) + ": " + winner.describe() + "\n" +
                           config::to_yaml(config::load_recipe(a.base_recipe, overrides));
  if (!a.recipe_out.empty()) write_text(a.recipe_out, yaml);
  return a.measure > 0 && !measured_ok ? 1 : 0;
}

// --validate-memory: the memory sweep (planner/memory_validation.h) on --recipe's model and data.
// Returns 0 when every row meets the target, 1 otherwise.
int validate_memory(PlanArgs& a) {
  if (a.base_recipe.empty())
    throw std::invalid_argument("--validate-memory needs --recipe FILE: the runs train its model on its data");
  const auto cases = select_memory_cases(a.memory_cases);
  config::Recipe recipe;
  try {
    recipe = config::load_recipe(a.base_recipe, a.recipe_overrides);
  } catch (const config::RecipeError& e) {
    throw std::invalid_argument(fmt::format("--recipe {}: invalid recipe:\n{}", a.base_recipe, e.what()));
  }
  MemorySweepOptions opt;
  opt.measure = a.mopt;
  if (!a.was_given("--measure-steps")) opt.measure.steps = 2;  // the second step: every buffer exists by then
  if (!a.was_given("--measure-skip")) opt.measure.skip_steps = 0;
  if (!a.was_given("--measure-dir")) opt.measure.work_dir = "runs/plan-memory";
  if (opt.measure.steps < 1 || opt.measure.skip_steps < 0 || opt.measure.skip_steps >= opt.measure.steps)
    throw std::invalid_argument("--measure-steps must be >= 1 and --measure-skip below it");
  opt.measure.loom_exe = launch::self_executable();
  opt.measure.recipe_path = a.base_recipe;
  opt.measure.overrides = a.recipe_overrides;
  const char* plugin = std::getenv("LOOM_DEVICE_PLUGIN");
  opt.cuda = plugin == nullptr || *plugin == '\0';
  const RecipePlanInput in = plan_input_from_recipe(recipe);
  // Without a GPU the runs fail with the trainer's advice to use CPU ranks, which holds for
  // training but not here: CPU ranks keep no allocator statistics, the stand-in device does.
  std::fprintf(stderr, "loom plan --validate-memory: %s, %zu cases on %s\n", in.shape.summary().c_str(),
               cases.size(),
               opt.cuda ? "CUDA (LOOM_DEVICE_PLUGIN is unset; on a host without a GPU set it to the stand-in "
                          "device, build/lib/libloom_standin_device.so: tests/standin_device/README.md)"
                        : fmt::format("the device plugin {}", plugin).c_str());
  const MemorySweep sweep = run_memory_sweep(opt, recipe, in.shape, cases);
  std::printf("%s", format_memory_sweep(sweep).c_str());
  return sweep.meets() ? 0 : 1;
}

// The command after parsing: resolve the request, search, report, then measure and write the
// chosen recipe. Throws std::invalid_argument for bad input, other exceptions for failures.
int plan(PlanArgs& a) {
  if (a.validate_memory) return validate_memory(a);
  const BaseRecipe base = load_base_recipe(a);
  check_search_flags({{"--tp", a.tp}, {"--pp", a.pp}, {"--vp", a.vp}, {"--mbs", a.mbs}}, a.layers, a.top, a.keep,
                     a.tokens, a.price);
  check_measure_flags(a);
  std::string profile_text;
  const GpuSpec gpu = a.hw.resolve_gpu(!base.input.cpu, &profile_text);
  const int profile_ranks = profile_text.empty() ? 0 : measured_ranks(profile_text);
  if (a.validate) {
    auto checks = check_published(true, {gpu});
    std::fprintf(stderr, "%s", format_checks(checks).c_str());
    return 0;
  }
  const PlanRequest req = resolve_request(a, base.input, gpu, profile_ranks);
  const SearchResult result = search(req.ctx.shape, req.ctx.cluster, req.ctx.setup, req.space, req.keep);
  if (const int status = report_search(a, req, result, base.input); status != 0) return status;
  if (a.base_recipe.empty()) return write_planned_recipe(a, req, result.best.front());
  return write_recipe_with_layout(a, base, result);
}

}  // namespace

int run_plan_command(int argc, char** argv) {
  CLI::App app{kPlanHelp};
  PlanArgs args;
  args.mopt.work_dir = "runs/plan-measure";
  add_model_and_search_flags(app, args);
  add_output_and_measure_flags(app, args);
  return parse_and_run(app, argc, argv, "loom plan", [&] {
    record_given_flags(app, args);
    return plan(args);
  });
}

}  // namespace loom::planner
