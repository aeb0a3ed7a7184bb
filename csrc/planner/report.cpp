#include "planner/report.h"

#include "planner/text_io.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>

namespace loom::planner {
namespace {

constexpr double kGiB = 1073741824.0;

struct Term {
  const char* name;
  double TimeBreakdown::*field;
};
const Term kTerms[] = {{"gemm", &TimeBreakdown::gemm},          {"attention", &TimeBreakdown::attention},
                       {"memory_bound", &TimeBreakdown::memory_bound}, {"tp_comm", &TimeBreakdown::tp_comm},
                       {"pp_comm", &TimeBreakdown::pp_comm},    {"bubble", &TimeBreakdown::bubble},
                       {"dp_comm", &TimeBreakdown::dp_comm},    {"recompute", &TimeBreakdown::recompute},
                       {"optimizer", &TimeBreakdown::optimizer}};

std::string yes_no(bool b) { return b ? "on" : "off"; }

}  // namespace

std::string format_table(const PlanContext& ctx, const std::vector<Candidate>& cands, std::size_t rows) {
  const bool days = ctx.token_budget > 0, cost = days && ctx.price_per_gpu_hour > 0;
  std::string s = fmt::format(
      "{:>4} {:>3} {:>3} {:>9} {:>3} {:>5} {:>4} {:>3} {:<17} {:>4} {:>7} {:>8} | {:>6} {:>6} {:>6} {:>6} "
      "{:>6} {:>6} {:>6} {:>6} {:>6} | {:>9} {:>6} {:>5}",
      "rank", "TP", "PP", "stages", "VP", "DP", "MBS", "SP", "recompute", "dopt", "mem GiB", "step s", "gemm",
      "attn", "membnd", "tp", "pp", "bubble", "dp", "recomp", "optim", "tokens/s", "TFLOPs", "MFU");
  if (days) s += fmt::format(" {:>7}", "days");
  if (cost) s += fmt::format(" {:>11}", "cost");
  s += "\n";
  for (std::size_t i = 0; i < cands.size() && i < rows; ++i) {
    const Candidate& c = cands[i];
    const Layout& L = c.layout;
    const TimeBreakdown& t = c.time;
    const Throughput th = throughput(ctx.shape, ctx.cluster, ctx.setup, c, ctx.token_budget, ctx.price_per_gpu_hour);
    s += fmt::format(
        "{:>4} {:>3} {:>3} {:>9} {:>3} {:>5} {:>4} {:>3} {:<17} {:>4} {:>7.1f} {:>8.3f} | {:>6.3f} {:>6.3f} "
        "{:>6.3f} {:>6.3f} {:>6.3f} {:>6.3f} {:>6.3f} {:>6.3f} {:>6.3f} | {:>9.0f} {:>6.{}f} {:>4.1f}%",
        i + 1, L.tp, L.pp, stage_split_text(ctx.shape, L), L.vp, L.dp, L.micro_batch, yes_no(L.sequence_parallel), L.recompute_name(),
        yes_no(L.distributed_optimizer), c.memory.terms.total() / kGiB, t.total(), t.gemm, t.attention,
        t.memory_bound, t.tp_comm, t.pp_comm, t.bubble, t.dp_comm, t.recompute, t.optimizer,
        th.tokens_per_second, th.model_tflops_per_gpu,
        th.model_tflops_per_gpu < 1 ? 3 : 1,  // CPU ranks reach hundredths of a TFLOP/s
        100 * th.mfu);
    if (days) s += fmt::format(" {:>7.1f}", th.days);
    if (cost) s += fmt::format(" {:>11.0f}", th.cost);
    s += "\n";
  }
  return s;
}

std::string format_csv(const PlanContext& ctx, const std::vector<Candidate>& cands) {
  struct Row {
    const Candidate* c;
    Throughput th;
    const Layout& L() const { return c->layout; }
    const MemoryTerms& m() const { return c->memory.terms; }
    bool full() const { return c->layout.recompute.full(); }
  };
  std::vector<Row> rows;
  for (const auto& c : cands)
    rows.push_back({&c, throughput(ctx.shape, ctx.cluster, ctx.setup, c, ctx.token_budget, ctx.price_per_gpu_hour)});
  using Col = CsvColumn<Row>;
  std::vector<Col> cols = {
      {"rank", [](const Row&, std::size_t rank) { return std::to_string(rank); }},
      csv_value<Row>("tp", [](const Row& r) { return r.L().tp; }),
      csv_value<Row>("pp", [](const Row& r) { return r.L().pp; }),
      csv_value<Row>("vp", [](const Row& r) { return r.L().vp; }),
      csv_value<Row>("dp", [](const Row& r) { return r.L().dp; }),
      csv_value<Row>("micro_batch", [](const Row& r) { return r.L().micro_batch; }),
      csv_value<Row>("sequence_parallel", [](const Row& r) { return r.L().sequence_parallel ? 1 : 0; }),
      csv_value<Row>("recompute_granularity", [](const Row& r) { return recipe_name(r.L().recompute.granularity); }),
      csv_value<Row>("recompute_method", [](const Row& r) { return r.full() ? recipe_name(r.L().recompute.method) : ""; }),
      csv_value<Row>("recompute_num_layers", [](const Row& r) {
        return r.full() ? std::to_string(r.L().recompute.num_layers.value_or(0)) : std::string();
      }),
      csv_value<Row>("distributed_optimizer", [](const Row& r) { return r.L().distributed_optimizer ? 1 : 0; }),
      csv_value<Row>("fits", [](const Row& r) { return r.c->fits ? 1 : 0; }),
      csv_value<Row>("worst_stage", [](const Row& r) { return r.c->memory.stage; }),
      csv_fixed<Row>("memory_gib", 3, [](const Row& r) { return r.m().total() / kGiB; }),
      csv_fixed<Row>("weights_optimizer_gib", 3, [](const Row& r) { return r.m().weights_optimizer / kGiB; }),
      csv_fixed<Row>("activations_gib", 3, [](const Row& r) { return r.m().activations / kGiB; }),
      csv_fixed<Row>("embedding_logits_gib", 3, [](const Row& r) { return r.m().embedding_logits / kGiB; }),
      csv_fixed<Row>("transient_gib", 3, [](const Row& r) { return r.m().transient / kGiB; }),
      csv_fixed<Row>("reserve_gib", 3, [](const Row& r) { return r.m().reserve / kGiB; }),
      csv_fixed<Row>("step_seconds", 4, [](const Row& r) { return r.c->time.total(); })};
  for (const auto& term : kTerms)
    cols.push_back(csv_fixed<Row>(std::string(term.name) + "_s", 4, [f = term.field](const Row& r) { return r.c->time.*f; }));
  for (Col col : {csv_fixed<Row>("tokens_per_second", 1, [](const Row& r) { return r.th.tokens_per_second; }),
                  csv_fixed<Row>("model_tflops_per_gpu", 2, [](const Row& r) { return r.th.model_tflops_per_gpu; }),
                  csv_fixed<Row>("mfu", 4, [](const Row& r) { return r.th.mfu; }),
                  csv_fixed<Row>("days", 3, [](const Row& r) { return r.th.days; }),
                  csv_fixed<Row>("cost", 2, [](const Row& r) { return r.th.cost; }),
                  csv_value<Row>("first_stage_layers",
                                 [layers = ctx.shape.num_layers](const Row& r) { return r.L().stage_layers(layers, 0); }),
                  csv_value<Row>("last_stage_layers", [layers = ctx.shape.num_layers](const Row& r) {
                    return r.L().stage_layers(layers, r.L().pp - 1);
                  })})
    cols.push_back(std::move(col));
  return csv_table(cols, rows);
}

std::string recipe_yaml(const PlanContext& ctx, const Candidate& best) {
  const Layout& L = best.layout;
  const ModelShape& m = ctx.shape;
  const Throughput th = throughput(ctx.shape, ctx.cluster, ctx.setup, best, ctx.token_budget, ctx.price_per_gpu_hour);
  const bool full = L.recompute.granularity == RecomputeGranularity::kFull;
  std::string s;
  s += fmt::format("# Written by `loom plan` for {} on {} x {} {} ({} GPUs).\n", m.summary(),
                   ctx.cluster.num_nodes, ctx.cluster.gpus_per_node, ctx.cluster.gpu.name, ctx.cluster.world());
  s += fmt::format("# Predicted: {:.3f} s/step, {:.0f} tokens/s, {:.1f} model TFLOP/s per GPU (MFU {:.1f}%),\n",
                   best.step_seconds(), th.tokens_per_second, th.model_tflops_per_gpu, 100 * th.mfu);
  s += fmt::format("# {:.1f} GiB on the worst stage ({}) of {:.0f} GiB.", best.memory.terms.total() / kGiB,
                   best.memory.stage, ctx.cluster.gpu.memory_gib);
  if (th.days > 0) s += fmt::format(" {:.1f} days for {:.3g} tokens.", th.days, ctx.token_budget);
  s += "\n" + format_stage_memory(ctx, L, "# ");
  s += "trainer:\n";
  s += fmt::format("  num_nodes: {}\n  devices: {}\n  accelerator: gpu\n  precision: {}\n",
                   ctx.cluster.num_nodes, ctx.cluster.gpus_per_node, recipe_name(ctx.setup.precision));
  s += "model:\n";
  s += fmt::format("  micro_batch_size: {}\n  global_batch_size: {}\n", L.micro_batch, ctx.setup.global_batch);
  s += fmt::format("  tensor_model_parallel_size: {}\n  pipeline_model_parallel_size: {}\n", L.tp, L.pp);
  s += fmt::format("  virtual_pipeline_model_parallel_size: {}\n", L.vp > 1 ? std::to_string(L.vp) : "null");
  if (L.uneven())  // the split's uneven end stages (null: an even share)
    s += fmt::format("  num_layers_in_first_pipeline_stage: {}\n  num_layers_in_last_pipeline_stage: {}\n",
                     L.first_stage_layers ? std::to_string(*L.first_stage_layers) : "null",
                     L.last_stage_layers ? std::to_string(*L.last_stage_layers) : "null");
  s += fmt::format("  sequence_parallel: {}\n", L.sequence_parallel ? "true" : "false");
  s += fmt::format("  encoder_seq_length: {}\n  max_position_embeddings: {}\n", m.seq_length, m.seq_length);
  s += fmt::format("  num_layers: {}\n  hidden_size: {}\n  ffn_hidden_size: {}\n  num_attention_heads: {}\n",
                   m.num_layers, m.hidden_size, m.ffn(), m.num_attention_heads);
  if (ctx.setup.fused_attention)  // the fused core needs attention dropout 0 (rules::fused_attention_violations)
    s += "  use_flash_attention: true\n  attention_dropout: 0.0\n";
  s += fmt::format("  activations_checkpoint_granularity: {}\n",
                   recipe_name(L.recompute.granularity));
  s += fmt::format("  activations_checkpoint_method: {}\n", full ? recipe_name(L.recompute.method) : "null");
  s += fmt::format("  activations_checkpoint_num_layers: {}\n", full ? std::to_string(L.recompute.num_layers.value_or(0)) : "null");
  s += "  data:\n";
  s += fmt::format("    seq_length: {}\n", m.seq_length);
  s += "  optim:\n";
  s += fmt::format("    name: {}\n", L.distributed_optimizer ? "distributed_fused_adam" : "fused_adam");
  return s;
}

std::string stage_split_text(const ModelShape& m, const Layout& L) {
  if (!L.uneven()) return "even";
  const int first = L.stage_layers(m.num_layers, 0), last = L.stage_layers(m.num_layers, L.pp - 1);
  if (L.pp == 2) return fmt::format("{},{}", first, last);
  return fmt::format("{},{}x{},{}", first, L.stage_layers(m.num_layers, 1), L.pp - 2, last);
}

std::string format_stage_memory(const PlanContext& ctx, const Layout& L, const std::string& prefix) {
  const double capacity = ctx.cluster.gpu.memory_gib * kGiB;
  const auto stages = every_stage_memory(ctx.shape, ctx.setup, L, capacity);
  const WorstStage worst = worst_stage_memory(ctx.shape, ctx.setup, L, capacity);
  std::string s = prefix + fmt::format("memory per stage of {} (GiB per GPU):\n", L.describe());
  s += prefix + fmt::format("{:>5} {:>6} {:>9} {:>11} {:>11} {:>9} {:>11} {:>7} {:>7}\n", "stage", "layers",
                            "in-flight", "weights+opt", "activations", "emb/logit", "working-set", "reserve",
                            "total");
  for (const StageMemory& st : stages) {
    const MemoryTerms& m = st.terms;
    s += prefix + fmt::format("{:>5} {:>6} {:>9} {:>11.2f} {:>11.2f} {:>9.2f} {:>11.2f} {:>7.2f} {:>7.2f}{}\n", st.stage,
                              st.layers, st.in_flight, m.weights_optimizer / kGiB, m.activations / kGiB,
                              m.embedding_logits / kGiB, m.transient / kGiB, m.reserve / kGiB, m.total() / kGiB,
                              st.stage == worst.stage ? "  <- worst" : "");
  }
  return s;
}

std::string describe_memory(const PlanContext& ctx, const Candidate& c) {
  const MemoryTerms& m = c.memory.terms;
  const double cap = ctx.cluster.gpu.memory_gib;
  std::string s = fmt::format(
      "  worst stage {}: weights+grads+optimizer {:.2f}, layer activations {:.2f}, embedding/logits "
      "{:.2f}, recompute working set {:.2f}, reserve {:.2f} = {:.2f} of {:.0f} GiB",
      c.memory.stage, m.weights_optimizer / kGiB, m.activations / kGiB, m.embedding_logits / kGiB,
      m.transient / kGiB, m.reserve / kGiB, m.total() / kGiB, cap);
  if (c.fits)
    s += fmt::format(" (headroom {:.2f} GiB; largest term: {})\n", cap - m.total() / kGiB, m.largest_term());
  else
    s += fmt::format(" -> does not fit by {:.2f} GiB; binding term: {}\n", m.total() / kGiB - cap, m.largest_term());
  return s;
}

std::string explain(const PlanContext& ctx, const SearchResult& result, std::size_t compare) {
  std::string s;
  if (result.best.empty()) {
    s += "No layout fits in memory.";
    if (!result.best_unfit.empty()) {
      s += fmt::format(" The fastest layout, {}, needs:\n", result.best_unfit.front().layout.describe());
      s += describe_memory(ctx, result.best_unfit.front());
    }
    return s + "\n";
  }
  const Candidate& win = result.best.front();
  s += fmt::format("Winner {}: {:.3f} s/step.\n", win.layout.describe(), win.step_seconds());
  s += describe_memory(ctx, win);
  if (win.layout.pp > 1) s += format_stage_memory(ctx, win.layout, "  ");
  for (std::size_t i = 1; i < result.best.size() && i <= compare; ++i) {
    const Candidate& other = result.best[i];
    std::vector<std::pair<double, const char*>> diffs;
    for (const auto& term : kTerms) diffs.push_back({other.time.*term.field - win.time.*term.field, term.name});
    std::sort(diffs.begin(), diffs.end(),
              [](const auto& a, const auto& b) { return std::abs(a.first) > std::abs(b.first); });
    s += fmt::format("vs #{} {} ({:.3f} s, +{:.1f}%):", i + 1, other.layout.describe(), other.step_seconds(),
                     100 * (other.step_seconds() / win.step_seconds() - 1));
    for (std::size_t k = 0; k < 3 && k < diffs.size(); ++k)
      if (std::abs(diffs[k].first) > 1e-6)
        s += fmt::format(" {} {:+.3f} s", diffs[k].second, diffs[k].first);
    s += fmt::format("; memory {:.1f} vs {:.1f} GiB\n", other.memory.terms.total() / kGiB,
                     win.memory.terms.total() / kGiB);
  }
  if (!result.unfit_by_term.empty()) {
    s += fmt::format("{} of {} valid layouts do not fit; binding terms:", result.enumerated - result.fitting,
                     result.enumerated);
    for (const auto& [term, n] : result.unfit_by_term) s += fmt::format(" {} {}", term, n);
    s += "\n";
    // Of the kept faster layouts that do not fit, the one closest to fitting.
    const Candidate* near = nullptr;
    for (const Candidate& f : result.best_unfit)
      if (f.step_seconds() < win.step_seconds() &&
          (!near || f.memory.terms.total() < near->memory.terms.total()))
        near = &f;
    if (near) {
      s += fmt::format("Faster but out of memory (closest to fitting): {} at {:.3f} s/step:\n",
                       near->layout.describe(), near->step_seconds());
      s += describe_memory(ctx, *near);
    }
  }
  return s;
}

std::string describe_recipe_layout(const PlanContext& ctx, const SearchResult& result, const Layout& layout) {
  const std::string why = check_layout(ctx.shape, ctx.cluster, ctx.setup, layout);
  if (!why.empty()) return fmt::format("\nThe recipe's layout {} is not valid here: {}\n", layout.describe(), why);
  const Candidate own = evaluate(ctx.shape, ctx.cluster, ctx.setup, layout);
  std::string s = fmt::format("\nThe recipe's layout {}: {:.3f} s/step predicted, {:.2f} GiB on the worst stage",
                              layout.describe(), own.step_seconds(), own.memory.terms.total() / kGiB);
  // What the trainer's log prints beside it: the parameters its ranks hold ("N parameters on
  // rank 0" is stage 0's) and the model FLOPs its MFU counts (ModelShape::model_flops_per_sample).
  std::string params;
  for (int stage = 0; stage < layout.pp; ++stage)
    params += fmt::format("{}{:.0f}", stage ? ", " : "", stage_params(ctx.shape, layout, stage));
  const std::string counts = fmt::format(
      "\n  parameters per GPU by stage: {}; model FLOPs per step: {:.9e}\n", params,
      ctx.shape.model_flops_per_sample(layout.tp) * double(ctx.setup.global_batch));
  if (!own.fits) return s + fmt::format(" -> does not fit; binding term: {}", own.memory.terms.largest_term()) + counts;
  std::size_t rank = 1;
  for (const auto& c : result.best)
    if (c.step_seconds() < own.step_seconds()) ++rank;
  const double best = result.best.front().step_seconds();
  s += rank > result.best.size() ? fmt::format(", below the {} layouts kept", result.best.size())
                                 : fmt::format(", rank {} of {}", rank, result.fitting);
  if (best < own.step_seconds()) s += fmt::format("; the best layout is {:.1f}% faster", 100 * (own.step_seconds() / best - 1));
  return s + counts;
}

}  // namespace loom::planner
