#include "planner/cli.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "config/recipe.h"
#include "launch/local_launcher.h"
#include "planner/measure.h"
#include "planner/measure_report.h"
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

}  // namespace

int run_plan_command(int argc, char** argv) {
  CLI::App app{
      "Plan a training layout: search every TP/PP/VP/DP/micro-batch/SP/recompute/optimizer layout "
      "with an analytic memory and speed model and rank those that fit by predicted step time."};
  app.name(argc > 0 ? argv[0] : "loom plan");

  ModelFlags model;
  HardwareFlags hw;
  int top = 10;
  long long keep_flag = 200;
  std::string csv_path, recipe_path, precision = "bf16";
  double tokens = 0, price = 0;
  bool explain_flag = false, validate = false;
  TrainingSetup setup;
  setup.global_batch = 0;
  std::vector<int> tp, pp, vp, mbs, layers;
  std::vector<std::string> sp, recompute, method, dopt;
  std::string base_recipe;
  std::vector<std::string> recipe_overrides;
  int measure = 0;
  MeasureOptions mopt;
  mopt.work_dir = "runs/plan-measure";
  std::string measure_pick = "top", measure_csv;
  int profile_ranks = 0, measure_repeats = 1;

  app.add_option("--recipe", base_recipe,
                 "Plan for a recipe's model, batch, precision and cluster (explicit flags win); its own "
                 "layout is ranked too, and --write-recipe/--measure apply layouts to it");
  app.add_option("overrides", recipe_overrides, "Dotted overrides of --recipe, e.g. model.global_batch_size=16");
  model.add_to(app, "Sequence length s");
  hw.add_to(app);
  app.add_option("--global-batch-size", setup.global_batch, "Global batch (samples per step)");
  app.add_option("--tokens", tokens, "Token budget, e.g. 300e9 (adds a days column)");
  app.add_option("--price", price, "Price per GPU-hour (adds a cost column; needs --tokens)");
  app.add_option("--precision", precision, "bf16, 16 (fp16) or 32 (fp32, CPU ranks)")->capture_default_str();
  app.add_option("--reserve-gib", setup.reserve_gib, "Memory reserved per GPU (context, NCCL, cuBLAS)")
      ->capture_default_str();
  app.add_option("--fragmentation", setup.fragmentation_fraction, "Fraction of memory kept for fragmentation")
      ->capture_default_str();
  app.add_flag("--overlap-dp-comm", setup.overlap_dp_comm,
               "Model DP gradient reduction overlapped with the last backward");
  app.add_option("--tp", tp, "Allowed tensor-parallel sizes (list)")->delimiter(',');
  app.add_option("--pp", pp, "Allowed pipeline sizes (list)")->delimiter(',');
  app.add_option("--vp", vp, "Allowed virtual stages per pipeline rank (list; 1 = no interleaving)")->delimiter(',');
  app.add_option("--mbs", mbs, "Allowed micro-batch sizes (list)")->delimiter(',');
  app.add_option("--sp", sp, "Sequence parallelism: on, off or on,off")->delimiter(',');
  app.add_option("--recompute", recompute, "RecomputeGranularity granularity: none, selective, full (list)")->delimiter(',');
  app.add_option("--recompute-method", method, "Full recompute method: uniform, block (list)")->delimiter(',');
  app.add_option("--recompute-layers", layers, "activations_checkpoint_num_layers values (list)")->delimiter(',');
  app.add_option("--dist-opt", dopt, "Distributed optimizer: on, off or on,off")->delimiter(',');
  app.add_option("--top", top, "Rows of the terminal table")->capture_default_str();
  app.add_option("--keep", keep_flag, "Layouts kept for the table and CSV")->capture_default_str();
  app.add_option("--csv", csv_path, "Write the ranked layouts as CSV to FILE ('-' = stdout)");
  app.add_option("--write-recipe", recipe_path, "Write the best layout as a recipe YAML to FILE ('-' = stdout)");
  app.add_flag("--explain", explain_flag, "Explain why the winner wins and which memory term binds");
  app.add_option("--measure", measure,
                 "Train K layouts for a few steps through the launcher on this machine (needs --recipe) "
                 "and re-rank them by measured step time");
  app.add_option("--measure-pick", measure_pick,
                 "Which K: 'top' (the K fastest predicted) or 'spread' (the best, the worst and layouts "
                 "evenly spaced in predicted step time between them: a check of the model's ordering)")
      ->capture_default_str();
  app.add_option("--measure-steps", mopt.steps, "Optimizer steps per measured run")->capture_default_str();
  app.add_option("--measure-skip", mopt.skip_steps, "First steps left out of the mean")->capture_default_str();
  app.add_option("--measure-timeout", mopt.timeout_s, "Seconds before a run is stopped (classified timeout)")
      ->capture_default_str();
  app.add_option("--measure-repeats", measure_repeats,
                 "Runs per layout, round-robin; each keeps its fastest and the spread of its runs is shown")
      ->capture_default_str();
  app.add_option("--measure-dir", mopt.work_dir, "Directory of the measured runs")->capture_default_str();
  app.add_option("--measure-csv", measure_csv, "Write the measured table as CSV to FILE ('-' = stdout)");
  app.add_flag("--validate", validate,
               "Reproduce the published A100 results (Korthikanti 2022, Narayanan 2021) and exit");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  try {
    config::Recipe recipe;
    RecipePlanInput from_recipe;
    if (!base_recipe.empty()) {
      try {
        recipe = config::load_recipe(base_recipe, recipe_overrides);
      } catch (const config::RecipeError& e) {
        throw std::invalid_argument(fmt::format("--recipe {}: invalid recipe:\n{}", base_recipe, e.what()));
      }
      from_recipe = plan_input_from_recipe(recipe);
      if (!app.count("--gpu") && !from_recipe.gpu.empty()) hw.gpu_name = from_recipe.gpu;
      if (from_recipe.cpu && hw.profile.empty())
        throw std::invalid_argument(fmt::format(
            "--recipe {} trains on CPU ranks, which have no built-in profile: measure them with "
            "`loom plan calibrate --devices {} --out cpu.json` and pass --profile cpu.json",
            base_recipe, from_recipe.devices));
    } else if (!recipe_overrides.empty()) {
      throw std::invalid_argument(fmt::format("unexpected argument '{}' (overrides need --recipe FILE)",
                                              recipe_overrides.front()));
    }
    check_search_flags({{"--tp", tp}, {"--pp", pp}, {"--vp", vp}, {"--mbs", mbs}}, layers, top, keep_flag, tokens,
                       price);
    std::size_t keep = static_cast<std::size_t>(keep_flag);
    if (measure < 0) throw std::invalid_argument(fmt::format("--measure must be >= 0, found {}", measure));
    if (measure > 0 && base_recipe.empty())
      throw std::invalid_argument("--measure needs --recipe FILE: the runs train its model on its data");
    if (measure_pick != "top" && measure_pick != "spread")
      throw std::invalid_argument(fmt::format("--measure-pick: expected top or spread, found '{}'", measure_pick));
    if (mopt.steps < 1 || mopt.skip_steps < 0 || mopt.skip_steps >= mopt.steps)
      throw std::invalid_argument(fmt::format(
          "--measure-steps {} and --measure-skip {}: need steps >= 1 and 0 <= skip < steps", mopt.steps,
          mopt.skip_steps));
    if (!(mopt.timeout_s > 0)) throw std::invalid_argument("--measure-timeout must be > 0");
    if (measure_repeats < 1)
      throw std::invalid_argument(fmt::format("--measure-repeats must be >= 1, found {}", measure_repeats));

    std::string profile_text;
    const GpuSpec gpu = hw.resolve_gpu(!from_recipe.cpu, &profile_text);
    if (!profile_text.empty()) profile_ranks = measured_ranks(profile_text);

    if (validate) {
      auto checks = check_published(gpu, true);
      std::fprintf(stderr, "%s", format_checks(checks).c_str());
      return 0;
    }

    ModelShape shape;
    if (!base_recipe.empty()) {
      if (model.given())
        throw std::invalid_argument("give the model either by --recipe or by --size/--num-layers..., not both");
      shape = from_recipe.shape;
      if (app.count("--seq-length")) shape.seq_length = model.shape.seq_length;
      if (app.count("--vocab-size")) shape.vocab_size = model.shape.vocab_size;
      if (!app.count("--global-batch-size")) setup.global_batch = from_recipe.setup.global_batch;
      if (!app.count("--precision")) setup.precision = from_recipe.setup.precision;
      if (!app.count("--nodes")) hw.nodes = from_recipe.num_nodes;
      if (!app.count("--gpus-per-node")) hw.gpus_per_node = from_recipe.devices;
      if (measure > 0 && (hw.nodes != 1 || hw.gpus_per_node != from_recipe.devices))
        throw std::invalid_argument(fmt::format(
            "--measure runs the layouts on this machine with the recipe's ranks: plan for 1 node of "
            "trainer.devices = {} (found --nodes {} --gpus-per-node {}); change trainer.devices instead",
            from_recipe.devices, hw.nodes, hw.gpus_per_node));
      // CPU ranks have no CUDA context, NCCL or cuBLAS workspaces to reserve memory for.
      if (from_recipe.cpu && !app.count("--reserve-gib")) setup.reserve_gib = 0.5;
      if (from_recipe.cpu && !app.count("--fragmentation")) setup.fragmentation_fraction = 0;
      shape.validate();
    } else {
      shape = model.resolve();
    }
    if (base_recipe.empty() || app.count("--precision")) {
      if (precision == "bf16") setup.precision = Precision::kBf16;
      else if (precision == "16" || precision == "fp16") setup.precision = Precision::kFp16;
      else if (precision == "32" || precision == "fp32") setup.precision = Precision::kFp32;
      else throw std::invalid_argument(fmt::format("--precision: expected bf16, 16 or 32, found '{}'", precision));
    }
    if (setup.global_batch <= 0)
      throw std::invalid_argument("--global-batch-size is required (or --recipe with model.global_batch_size)");
    if (price > 0 && tokens <= 0) throw std::invalid_argument("--price needs --tokens (the token budget)");

    PlanContext ctx;
    ctx.shape = shape;
    ctx.cluster = hw.cluster(gpu);
    ctx.setup = setup;
    if (profile_ranks > 0 && from_recipe.cpu && profile_ranks != ctx.cluster.gpus_per_node)
      std::fprintf(stderr,
                   "loom plan: warning: %s was measured with %d ranks sharing this node but %d ranks are "
                   "planned; CPU ranks share cores and memory, so calibrate with --devices %d\n",
                   hw.profile.c_str(), profile_ranks, ctx.cluster.gpus_per_node, ctx.cluster.gpus_per_node);
    ctx.token_budget = tokens;
    ctx.price_per_gpu_hour = price;

    SearchSpace space;
    space.tp = tp; space.pp = pp; space.vp = vp; space.micro_batch = mbs;
    space.sequence_parallel = parse_switches(sp, "--sp");
    space.recompute = parse_recompute(recompute);
    space.method = parse_methods(method);
    space.recompute_layers = layers;
    space.distributed_optimizer = parse_switches(dopt, "--dist-opt");

    // Spreading the measured runs over the whole ranking needs the whole ranking.
    const std::size_t csv_rows = keep;  // --keep still bounds the CSV
    if (measure > 0 && measure_pick == "spread") keep = std::max<std::size_t>(keep, 1000000);
    SearchResult result = search(ctx.shape, ctx.cluster, ctx.setup, space, keep);
    std::fprintf(stderr, "loom plan: %s on %d x %d %s (%d %s, %.0f GiB), global batch %d\n",
                 shape.summary().c_str(), ctx.cluster.num_nodes, ctx.cluster.gpus_per_node,
                 gpu.name.c_str(), ctx.cluster.world(), from_recipe.cpu ? "CPU ranks" : "GPUs", gpu.memory_gib,
                 setup.global_batch);
    std::fprintf(stderr, "searched %zu valid layouts in %.3f s; %zu fit in memory\n", result.enumerated,
                 result.seconds, result.fitting);
    if (result.enumerated == 0) {
      std::fprintf(stderr,
                   "loom plan: no valid layout: every combination of the allowed --tp/--pp/--vp/--mbs/--sp/"
                   "--recompute values breaks a divisibility rule (t | heads, hidden, ffn and the %d devices; "
                   "p | layers; d·b | global batch %d; interleaving needs micro-batches %% p == 0)\n",
                   ctx.cluster.world(), setup.global_batch);
      return 1;
    }
    if (result.best.empty()) {
      std::fprintf(stderr, "%s", explain(ctx, result).c_str());
      if (!csv_path.empty()) write_text(csv_path, format_csv(ctx, result.best_unfit));
      std::fprintf(stderr, "loom plan: no layout fits in %.1f GiB per GPU\n", gpu.memory_gib);
      return 1;
    }
    std::fprintf(stderr, "%s", format_table(ctx, result.best, std::size_t(std::max(top, 0))).c_str());
    if (!base_recipe.empty()) std::fprintf(stderr, "%s", describe_recipe_layout(ctx, result, from_recipe.layout).c_str());
    if (explain_flag) std::fprintf(stderr, "\n%s", explain(ctx, result).c_str());
    if (!csv_path.empty()) {
      const std::vector<Candidate> rows(result.best.begin(),
                                        result.best.begin() + std::min(result.best.size(), csv_rows));
      write_text(csv_path, format_csv(ctx, rows));
    }

    Layout winner = result.best.front().layout;
    bool measured_ok = false;
    if (measure > 0) {
      mopt.loom_exe = launch::self_executable();
      mopt.recipe_path = base_recipe;
      mopt.overrides = recipe_overrides;
      std::vector<double> predicted;
      for (const auto& c : result.best) predicted.push_back(c.step_seconds());
      const auto picks = pick_for_measurement(predicted, std::size_t(measure), measure_pick == "spread");
      std::vector<MeasuredLayout> rows;
      for (std::size_t i = 0; i < picks.size(); ++i) rows.push_back({picks[i] + 1, result.best[picks[i]], {}});
      // Repeats go round-robin, so slow drifts of a shared machine touch every layout alike;
      // each layout keeps its fastest run (the least disturbed one).
      for (int round = 0; round < measure_repeats; ++round) {
        for (std::size_t i = 0; i < rows.size(); ++i) {
          MeasuredLayout& row = rows[i];
          std::fprintf(stderr, "[measure %zu/%zu%s] %s (predicted %.3f s/step) ...", i + 1, rows.size(),
                       measure_repeats > 1 ? fmt::format(", round {}/{}", round + 1, measure_repeats).c_str() : "",
                       row.candidate.layout.describe().c_str(), row.candidate.step_seconds());
          std::fflush(stderr);
          const Measurement m = measure_layout(mopt, recipe, row.candidate.layout, int(row.predicted_rank));
          std::fprintf(stderr, " %s\n", describe_measurement(m).c_str());
          row.measured = round == 0 ? m : keep_fastest(row.measured, m);
        }
      }
      rank_by_measurement(rows);
      std::fprintf(stderr, "\n%s", format_measured_table(rows, mopt).c_str());
      if (!measure_csv.empty()) write_text(measure_csv, format_measured_csv(rows));
      measured_ok = rows.front().measured.status == RunStatus::ok;
      if (measured_ok) winner = rows.front().candidate.layout;
      else std::fprintf(stderr, "loom plan: no measured run succeeded (see the status column)\n");
    }
    if (!base_recipe.empty()) {
      auto overrides = recipe_overrides;
      for (const auto& o : layout_overrides(winner, recipe)) overrides.push_back(o);
      const char* how = measure == 0 ? "" : measured_ok ? " (fastest measured run)" : " (predicted best; no measured run succeeded)";
      const std::string yaml = "# Layout chosen by `loom plan`" + std::string(how) + ": " + winner.describe() +
                               "\n" + config::to_yaml(config::load_recipe(base_recipe, overrides));
      if (!recipe_path.empty()) write_text(recipe_path, yaml);
      return measure > 0 && !measured_ok ? 1 : 0;
    }
    const std::string yaml = recipe_yaml(ctx, result.best.front());
    if (!recipe_path.empty()) write_text(recipe_path, yaml);
    else std::fprintf(stderr, "\n%s", yaml.c_str());
    return 0;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "loom plan: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom plan: %s\n", e.what());
    return 1;
  }
}

}  // namespace loom::planner
