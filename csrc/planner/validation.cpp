#include "planner/validation.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace loom::planner {
namespace {

ModelShape gpt(int layers, int hidden, int heads) {
  ModelShape m;
  m.num_layers = layers;
  m.hidden_size = hidden;
  m.num_attention_heads = heads;
  m.seq_length = 2048;
  m.vocab_size = 51200;
  return m;
}

// Hardware FLOPs per step that Narayanan et al. count: full recompute of every layer.
double narayanan_tflops_per_gpu(const ModelShape& m, int global_batch, int gpus, double step) {
  return m.full_recompute_flops_per_sample() * global_batch / step / gpus / 1e12;
}

}  // namespace

std::vector<PublishedRow> published_rows() {
  std::vector<PublishedRow> rows;
  using M = PublishedRow::Metric;
  struct K { const char* name; int L, h, a, gpus, t, p, v, gbs, b; double full, sel; };
  const K kor[] = {{"22B", 48, 6144, 64, 8, 8, 1, 1, 4, 4, 1.42, 1.10},
                   {"175B", 96, 12288, 96, 64, 8, 8, 3, 64, 1, 18.13, 13.75},
                   {"530B", 105, 20480, 128, 280, 8, 35, 3, 280, 1, 49.05, 37.83},
                   {"1T", 128, 25600, 160, 512, 8, 64, 1, 512, 1, 94.42, 71.49}};
  for (const auto& k : kor) {
    for (int sel = 0; sel < 2; ++sel) {
      PublishedRow r;
      r.source = "Korthikanti 2022";
      r.label = fmt::format("{} {}", k.name, sel ? "SP+selective" : "full recompute");
      r.shape = gpt(k.L, k.h, k.a);
      r.gpus = k.gpus; r.tp = k.t; r.pp = k.p; r.vp = k.v; r.global_batch = k.gbs; r.micro_batch = k.b;
      r.sequence_parallel = sel;
      r.recompute = sel ? RecomputeGranularity::kSelective : RecomputeGranularity::kFull;
      r.metric = M::iteration_seconds;
      r.published = sel ? k.sel : k.full;
      rows.push_back(r);
    }
  }
  struct N { const char* name; int a, h, L, t, p, gpus, gbs; double tflops; };
  const N nar[] = {{"1.7B", 24, 2304, 24, 1, 1, 32, 512, 137},
                   {"3.6B", 32, 3072, 30, 2, 1, 64, 512, 138},
                   {"7.5B", 32, 4096, 36, 4, 1, 128, 512, 142},
                   {"18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135},
                   {"39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138},
                   {"76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140},
                   {"145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148},
                   {"310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155},
                   {"529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163},
                   {"1008B", 160, 25600, 128, 8, 64, 3072, 3072, 163}};
  for (const auto& n : nar) {
    PublishedRow r;
    r.source = "Narayanan 2021";
    r.label = fmt::format("{} full recompute", n.name);
    r.shape = gpt(n.L, n.h, n.a);
    r.gpus = n.gpus; r.tp = n.t; r.pp = n.p; r.global_batch = n.gbs;
    r.recompute = RecomputeGranularity::kFull;
    r.metric = M::tflops_per_gpu;
    r.published = n.tflops;
    rows.push_back(r);
  }
  return rows;
}

std::vector<RowCheck> check_published(const GpuSpec& gpu, bool search_best) {
  std::vector<RowCheck> out;
  for (const auto& row : published_rows()) {
    Cluster cluster;
    cluster.gpu = gpu;
    cluster.gpus_per_node = 8;
    cluster.num_nodes = row.gpus / 8;
    TrainingSetup setup;
    setup.global_batch = row.global_batch;

    SearchSpace fixed;
    fixed.tp = {row.tp};
    fixed.pp = {row.pp};
    if (row.vp) fixed.vp = {row.vp};
    if (row.micro_batch) fixed.micro_batch = {row.micro_batch};
    fixed.sequence_parallel = {row.sequence_parallel ? 1 : 0};
    fixed.recompute = {row.recompute};
    if (row.recompute == RecomputeGranularity::kFull) {
      fixed.method = {RecomputeMethod::kUniform};
      fixed.recompute_layers = {1};
    }
    fixed.distributed_optimizer = {0};
    // Unpublished knobs: the fastest choice, fitting or not (the published run did fit).
    SearchResult r = search(row.shape, cluster, setup, fixed, 1);
    RowCheck check;
    check.row = row;
    if (!r.best.empty()) {
      check.published_layout = r.best.front();
      check.published_fits = true;
    } else if (!r.best_unfit.empty()) {
      check.published_layout = r.best_unfit.front();
    }
    const double step = check.published_layout.step_seconds();
    check.predicted = row.metric == PublishedRow::Metric::iteration_seconds
                          ? step
                          : narayanan_tflops_per_gpu(row.shape, row.global_batch, row.gpus, step);
    check.relative_error = (check.predicted - row.published) / row.published;
    if (search_best) {
      SearchResult all = search(row.shape, cluster, setup, SearchSpace{}, 1);
      if (!all.best.empty()) check.planner_best = all.best.front();
    }
    out.push_back(check);
  }
  return out;
}

std::string format_checks(const std::vector<RowCheck>& checks) {
  std::string s = fmt::format("{:<17} {:<26} {:<34} {:>9} {:>9} {:>7}  {}\n", "source", "row",
                              "layout", "published", "predicted", "error", "planner best");
  double sum = 0, worst = 0;
  for (const auto& c : checks) {
    const bool secs = c.row.metric == PublishedRow::Metric::iteration_seconds;
    std::string best = c.planner_best.step_seconds() > 0
                           ? fmt::format("{} {:.2f}s vs {:.2f}s", c.planner_best.layout.describe(),
                                         c.planner_best.step_seconds(), c.published_layout.step_seconds())
                           : "";
    s += fmt::format("{:<17} {:<26} {:<34} {:>8.2f}{} {:>8.2f}{} {:>+6.1f}%  {}{}\n", c.row.source,
                     c.row.label, c.published_layout.layout.describe(), c.row.published,
                     secs ? "s" : "T", c.predicted, secs ? "s" : "T", 100 * c.relative_error, best,
                     c.published_fits ? "" : "  [published layout predicted not to fit]");
    sum += std::abs(c.relative_error);
    worst = std::max(worst, std::abs(c.relative_error));
  }
  s += fmt::format("mean |error| {:.2f}%, worst {:.2f}% over {} rows (T = TFLOP/s per GPU)\n",
                   100 * sum / checks.size(), 100 * worst, checks.size());
  return s;
}

}  // namespace loom::planner
