#include "planner/validation.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

namespace loom::planner {
namespace {

ModelShape gpt(int layers, int hidden, int heads, int seq = 2048, int vocab = 51200) {
  return ModelShape{layers, hidden, heads, /*ffn_hidden_size: 4h*/ 0, seq, /*max_position_embeddings=*/seq, vocab};
}

// Llama 3 / 3.1 (Meta's config.json): RMSNorm, RoPE, SwiGLU, 8 query groups, no biases, untied
// output layer, vocabulary 128256 (a multiple of 128: no padding).
ModelShape llama3(int layers, int hidden, int ffn, int heads, int seq) {
  ModelShape m{layers, hidden, heads, ffn, seq, /*max_position_embeddings=*/seq, /*vocab_size=*/128256};
  m.normalization = Normalization::kRmsNorm;
  m.position_embedding_type = PositionEmbedding::kRope;
  m.rotary_base = 500000;
  m.activation = Activation::kSwiglu;
  m.num_query_groups = 8;
  m.bias = false;
  m.share_embeddings_and_output_weights = false;
  return m;
}

constexpr const char* kFitted = "fitted";
constexpr const char* kHeldH100 = "held-out H100";
constexpr const char* kHeld5B = "held-out 5B";
constexpr const char* kHeldLlama = "held-out Llama";

// Published per-GPU TFLOP/s rows of two tables: Narayanan et al. 2021's Table 1 (A100-80GB, full
// recompute; fitted) and the Megatron-LM README's H100 table (held out; add_h100 has its source).
enum TflopsSource { kNarayanan, kMegatronH100 };
struct TflopsRow {
  TflopsSource source;
  const char* name;
  int a, h, L, t, p, gpus, gbs;
  double tflops;
};
const TflopsRow kTflopsRows[] = {
    {kNarayanan, "1.7B", 24, 2304, 24, 1, 1, 32, 512, 137},
    {kNarayanan, "3.6B", 32, 3072, 30, 2, 1, 64, 512, 138},
    {kNarayanan, "7.5B", 32, 4096, 36, 4, 1, 128, 512, 142},
    {kNarayanan, "18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135},
    {kNarayanan, "39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138},
    {kNarayanan, "76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140},
    {kNarayanan, "145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148},
    {kNarayanan, "310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155},
    {kNarayanan, "529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163},
    {kNarayanan, "1008B", 160, 25600, 128, 8, 64, 3072, 3072, 163},
    {kMegatronH100, "1.7B", 16, 2048, 24, 1, 1, 48, 192, 408.8},
    {kMegatronH100, "7.1B", 32, 4096, 30, 2, 1, 96, 192, 465.9},
    {kMegatronH100, "16B", 48, 6144, 32, 4, 1, 192, 192, 489.1},
    {kMegatronH100, "32B", 56, 7168, 48, 8, 1, 384, 192, 459.6},
    {kMegatronH100, "70B", 64, 8192, 84, 8, 2, 768, 384, 419.7},
    {kMegatronH100, "119B", 80, 10240, 92, 8, 4, 1536, 768, 420.5},
    {kMegatronH100, "177B", 96, 12288, 96, 8, 6, 2304, 1152, 432.8},
    {kMegatronH100, "314B", 128, 16384, 96, 8, 8, 3072, 1536, 474.4},
    {kMegatronH100, "462B", 144, 18432, 112, 8, 16, 6144, 3072, 459.9},
};

PublishedRow tflops_row(const TflopsRow& x, const char* group, const char* source, PublishedRow::Metric metric) {
  PublishedRow r;
  r.group = group;
  r.source = source;
  r.gpus = x.gpus; r.layout.tp = x.t; r.layout.pp = x.p; r.setup.global_batch = x.gbs;
  r.metric = metric;
  r.published = x.tflops;
  return r;
}

void add_fitted(std::vector<PublishedRow>& rows) {
  using M = PublishedRow::Metric;
  struct K { const char* name; int L, h, a, gpus, t, p, v, gbs, b; double full, sel; };
  const K kor[] = {{"22B", 48, 6144, 64, 8, 8, 1, 1, 4, 4, 1.42, 1.10},
                   {"175B", 96, 12288, 96, 64, 8, 8, 3, 64, 1, 18.13, 13.75},
                   {"530B", 105, 20480, 128, 280, 8, 35, 3, 280, 1, 49.05, 37.83},
                   {"1T", 128, 25600, 160, 512, 8, 64, 1, 512, 1, 94.42, 71.49}};
  for (const auto& k : kor) {
    for (int sel = 0; sel < 2; ++sel) {
      PublishedRow r;
      r.group = kFitted;
      r.source = "Korthikanti 2022";
      r.label = fmt::format("{} {}", k.name, sel ? "SP+selective" : "full recompute");
      r.shape = gpt(k.L, k.h, k.a);
      r.gpus = k.gpus; r.layout.tp = k.t; r.layout.pp = k.p; r.layout.vp = k.v; r.setup.global_batch = k.gbs;
      r.layout.micro_batch = k.b;
      r.layout.sequence_parallel = sel;
      r.layout.recompute.granularity = sel ? RecomputeGranularity::kSelective : RecomputeGranularity::kFull;
      r.metric = M::iteration_seconds;
      r.published = sel ? k.sel : k.full;
      rows.push_back(r);
    }
  }
  for (const auto& n : kTflopsRows) {
    if (n.source != kNarayanan) continue;
    PublishedRow r = tflops_row(n, kFitted, "Narayanan 2021", M::tflops_per_gpu);
    r.label = fmt::format("{} full recompute", n.name);
    r.shape = gpt(n.L, n.h, n.a);
    r.layout.recompute.granularity = RecomputeGranularity::kFull;
    rows.push_back(r);
  }
}

// Megatron-LM README, "Training Speed and Scalability" / "Performance Benchmarking",
// images/model_table.png (commit f2e5db402c, 2024-07-15; unchanged since): Megatron-Core
// r0.8.0 on H100 with DP 48, s = 4096, V = 131072, BF16, the README's overlap flags.
void add_h100(std::vector<PublishedRow>& rows) {
  for (const auto& x : kTflopsRows) {
    if (x.source != kMegatronH100) continue;
    PublishedRow r = tflops_row(x, kHeldH100, "Megatron-LM README", PublishedRow::Metric::model_tflops_per_gpu);
    r.label = fmt::format("{} t{} p{} d48", x.name, x.t, x.p);
    r.gpu = "H100";
    r.shape = gpt(x.L, x.h, x.a, 4096, 131072);
    // Assumed (published_assumptions): the planner's fastest micro-batch and interleaving, as
    // for Narayanan's rows; no recompute (Megatron's default).
    r.layout.micro_batch = 0;
    r.layout.vp = 0;
    r.layout.recompute.granularity = RecomputeGranularity::kNone;
    r.layout.sequence_parallel = x.t > 1;    // --tp-comm-overlap needs --sequence-parallel
    r.layout.distributed_optimizer = true;   // --overlap-param-gather needs --use-distributed-optimizer
    r.setup.fused_attention = true;          // Transformer Engine's fused attention
    r.setup.overlap_tp_comm = x.t > 1;
    r.setup.overlap_dp_comm = true;          // --overlap-grad-reduce
    r.setup.overlap_param_gather = true;     // --overlap-param-gather
    rows.push_back(r);
  }
}

// NeMo-Megatron-Launcher README at its 2022-07 revision (e.g. commit 2e51f5f7, 2022-07-25),
// "Training Performance Results", 5B row; the run is conf/training/gpt3/5b.yaml of that
// revision: 24L h4096 a32, s = 2048, TP 2, PP 1, micro-batch 2, global batch 1440, bf16, no
// sequence parallelism, no recompute (full/block with 0 layers), fused_adam (no distributed
// optimizer), GPT-2 vocabulary padded to 128·t (50432); A100-80GB DGX nodes.
void add_5b(std::vector<PublishedRow>& rows) {
  const std::pair<int, double> table[] = {{1, 39543},   {2, 79128},   {5, 195047}, {9, 344523},
                                          {10, 383500}, {18, 670254}, {20, 731791}};
  for (const auto& [nodes, tokens] : table) {
    PublishedRow r;
    r.group = kHeld5B;
    r.source = "NeMo launcher README";
    r.label = fmt::format("5B {} node{} ({} GPUs)", nodes, nodes > 1 ? "s" : "", 8 * nodes);
    r.shape = gpt(24, 4096, 32, 2048, 50432);
    r.gpus = 8 * nodes; r.layout.tp = 2; r.layout.pp = 1; r.layout.vp = 1; r.layout.micro_batch = 2;
    r.setup.global_batch = 1440;
    r.layout.recompute.granularity = RecomputeGranularity::kNone;
    r.metric = PublishedRow::Metric::tokens_per_second;
    r.published = tokens;
    rows.push_back(r);
  }
}

// torchtitan's published Llama 3 / 3.1 throughput (tokens per second per GPU), FSDP2 in bf16 with
// PyTorch's fused SDPA attention, s = 8192, one local batch per step (no gradient
// accumulation): docs/performance.md (commit 0413364, A100-80GB, 64 GPUs, local batch 1) and
// benchmarks/llama3_h100_202412_torchtitan.md (commit 31a17bf, H100 96 GB HBM2e at 500 W,
// Tables 1 and 3, local batch 2, without torch.compile or Float8). Assumed (published_assumptions):
// FSDP as the distributed optimizer with both overlaps; selective op checkpointing as no
// recompute (it recomputes only non-matmul ops); full checkpointing as full recompute of every layer.
void add_llama(std::vector<PublishedRow>& rows) {
  struct T { const char* source; const char* label; const char* gpu; int billions, gpus, local_batch; bool full; double tps; };
  const T table[] = {
      {"torchtitan docs", "Llama 3 8B sel-op AC", "A100-80GB", 8, 64, 1, false, 2973},
      {"torchtitan docs", "Llama 3 70B full AC", "A100-80GB", 70, 64, 1, true, 331},
      {"torchtitan H100", "Llama 3.1 8B 8 GPUs", "H100", 8, 8, 2, false, 5762},
      {"torchtitan H100", "Llama 3.1 8B 128 GPUs", "H100", 8, 128, 2, false, 5605},
  };
  for (const auto& x : table) {
    PublishedRow r;
    r.group = kHeldLlama;
    r.source = x.source;
    r.label = x.label;
    r.gpu = x.gpu;
    r.shape = x.billions == 8 ? llama3(32, 4096, 14336, 32, 8192) : llama3(80, 8192, 28672, 64, 8192);
    r.gpus = x.gpus;
    r.layout.tp = 1; r.layout.pp = 1; r.layout.vp = 1; r.layout.micro_batch = x.local_batch;
    r.layout.recompute.granularity = x.full ? RecomputeGranularity::kFull : RecomputeGranularity::kNone;
    r.layout.distributed_optimizer = true;
    r.setup.global_batch = x.gpus * x.local_batch;
    r.setup.fused_attention = true;
    r.setup.attention_dropout = false;
    r.setup.overlap_dp_comm = true;
    r.setup.overlap_param_gather = true;
    r.metric = PublishedRow::Metric::tokens_per_second_per_gpu;
    r.published = x.tps;
    rows.push_back(r);
  }
}

double metric_of(const PublishedRow& row, double step) {
  using M = PublishedRow::Metric;
  switch (row.metric) {
    case M::iteration_seconds: return step;
    case M::tflops_per_gpu: return row.shape.full_recompute_flops_per_sample() * row.setup.global_batch / step / row.gpus / 1e12;
    case M::model_tflops_per_gpu: return row.shape.model_flops_per_sample() * row.setup.global_batch / step / row.gpus / 1e12;
    case M::tokens_per_second: return double(row.setup.global_batch) * row.shape.seq_length / step;
    case M::tokens_per_second_per_gpu: return double(row.setup.global_batch) * row.shape.seq_length / step / row.gpus;
  }
  return step;
}

const char* metric_unit(PublishedRow::Metric m) {
  using M = PublishedRow::Metric;
  switch (m) {
    case M::iteration_seconds: return "s";
    case M::tflops_per_gpu: return "T";
    case M::model_tflops_per_gpu: return "M";
    case M::tokens_per_second: return "t";
    case M::tokens_per_second_per_gpu: return "g";
  }
  return "";
}

std::vector<std::pair<const char*, double>> terms_of(const TimeBreakdown& t) {
  return {{"gemm", t.gemm},       {"attention", t.attention}, {"memory_bound", t.memory_bound},
          {"tp_comm", t.tp_comm}, {"pp_comm", t.pp_comm},     {"bubble", t.bubble},
          {"dp_comm", t.dp_comm}, {"recompute", t.recompute}, {"optimizer", t.optimizer}};
}

}  // namespace

Layout unpublished_layout() {
  Layout l;
  l.vp = 0;
  l.micro_batch = 0;
  l.recompute.granularity = RecomputeGranularity::kFull;
  return l;
}

std::vector<PublishedRow> published_rows() {
  std::vector<PublishedRow> rows;
  add_fitted(rows);
  add_h100(rows);
  add_5b(rows);
  add_llama(rows);
  return rows;
}

std::vector<std::string> published_assumptions() {
  return {"Megatron-LM README (H100): micro-batch, interleaving and recompute are not published; assumed no "
          "recompute (Megatron's default) and the planner's fastest fitting micro-batch and interleaving (as for "
          "Narayanan's rows); sequence parallelism and the distributed optimizer because the README's "
          "--tp-comm-overlap and --overlap-param-gather require them; TP, DP and PP communication overlapped as "
          "the README says; Transformer Engine's fused attention.",
          "NeMo launcher README (5B, 2022-07): every knob from that revision's conf/training/gpt3/5b.yaml "
          "(micro-batch 2, TP 2, no SP, no recompute, fused_adam); Megatron's unfused softmax attention of 2022.",
          "torchtitan (Llama): FSDP2 is planned as the distributed optimizer with overlapped gradient reduce-scatter "
          "and parameter all-gather (FSDP gathers the parameters again in backward: more traffic, also overlapped); "
          "selective op activation checkpointing as no recompute (it recomputes elementwise ops only), full "
          "checkpointing as full recompute of every layer; PyTorch's SDPA as fused attention; s = 8192 (torchtitan's "
          "Llama 3 configs). The H100 rows ran on 96 GB HBM2e H100s at 500 W, the planner's H100 is the 80 GB SXM at "
          "700 W: those rows are expected to be predicted fast."};
}

std::vector<RowCheck> check_published(bool search_best, const std::vector<GpuSpec>& gpus) {
  std::vector<RowCheck> out;
  for (const auto& row : published_rows()) {
    Cluster cluster;
    cluster.gpu = find_gpu(row.gpu, gpus);
    cluster.gpus_per_node = 8;
    cluster.num_nodes = row.gpus / 8;
    const TrainingSetup& setup = row.setup;
    const Layout& published = row.layout;

    SearchSpace fixed;
    fixed.tp = {published.tp};
    fixed.pp = {published.pp};
    if (published.vp) fixed.vp = {published.vp};
    if (published.micro_batch) fixed.micro_batch = {published.micro_batch};
    fixed.sequence_parallel = {published.sequence_parallel ? 1 : 0};
    fixed.recompute = {published.recompute.granularity};
    if (published.recompute.full()) {
      fixed.method = {RecomputeMethod::kUniform};
      fixed.recompute_layers = {1};
    }
    fixed.distributed_optimizer = {published.distributed_optimizer ? 1 : 0};
    fixed.uneven_stages = {0};  // the published runs split their layers evenly
    // Unpublished knobs: the fastest choice, fitting or not (the published run did fit).
    SearchResult r = search(row.shape, cluster, setup, fixed, 1);
    RowCheck check;
    check.row = row;
    check.capacity_gib = cluster.gpu.memory_gib;
    if (!r.best.empty()) {
      check.published_layout = r.best.front();
      check.published_fits = true;
    } else if (!r.best_unfit.empty()) {
      check.published_layout = r.best_unfit.front();
    }
    check.predicted = metric_of(row, check.published_layout.step_seconds());
    check.relative_error = (check.predicted - row.published) / row.published;
    if (search_best) {
      SearchResult all = search(row.shape, cluster, setup, SearchSpace{}, 1);
      if (!all.best.empty()) check.planner_best = all.best.front();
    }
    out.push_back(check);
  }
  return out;
}

std::vector<GroupError> group_errors(const std::vector<RowCheck>& checks) {
  std::vector<GroupError> out;
  for (const auto& c : checks) {
    auto it = std::find_if(out.begin(), out.end(), [&](const GroupError& g) { return g.group == c.row.group; });
    if (it == out.end()) it = out.insert(out.end(), GroupError{c.row.group});
    it->rows++;
    it->mean += std::abs(c.relative_error);
    it->worst = std::max(it->worst, std::abs(c.relative_error));
  }
  for (auto& g : out) g.mean /= std::max(1, g.rows);
  return out;
}

std::vector<TermAttribution> attribute_error(const std::vector<RowCheck>& group) {
  std::vector<TermAttribution> out;
  if (group.empty()) return out;
  const auto names = terms_of(TimeBreakdown{});
  for (size_t i = 0; i < names.size(); ++i) {
    TermAttribution best{names[i].first, 1.0, 1e300};
    bool present = false;
    for (const auto& c : group) present = present || terms_of(c.published_layout.time)[i].second > 0;
    if (!present) continue;
    for (double lk = std::log(0.2); lk <= std::log(5.0) + 1e-9; lk += 0.005) {
      const double k = std::exp(lk);
      double sum = 0;
      for (const auto& c : group) {
        const double step = c.published_layout.step_seconds();
        const double term = terms_of(c.published_layout.time)[i].second;
        sum += std::abs(metric_of(c.row, step + (k - 1) * term) / c.row.published - 1);
      }
      if (sum / group.size() < best.mean_after) best = {names[i].first, k, sum / group.size()};
    }
    out.push_back(best);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.mean_after < b.mean_after; });
  return out;
}

std::string format_checks(const std::vector<RowCheck>& checks) {
  std::string s;
  for (const auto& g : group_errors(checks)) {
    s += fmt::format("== {} ({} rows)\n", g.group, g.rows);
    s += fmt::format("{:<20} {:<28} {:<34} {:>10} {:>10} {:>7} {:>15}  {}\n", "source", "row", "layout", "published",
                     "predicted", "error", "GiB (headroom)", "planner best");
    std::vector<RowCheck> members;
    for (const auto& c : checks) {
      if (c.row.group != g.group) continue;
      members.push_back(c);
      const char* unit = metric_unit(c.row.metric);
      const bool big = c.row.metric == PublishedRow::Metric::tokens_per_second ||
                       c.row.metric == PublishedRow::Metric::tokens_per_second_per_gpu;
      std::string best = c.planner_best.step_seconds() > 0
                             ? fmt::format("{} {:.2f}s vs {:.2f}s", c.planner_best.layout.describe(),
                                           c.planner_best.step_seconds(), c.published_layout.step_seconds())
                             : "";
      s += fmt::format("{:<20} {:<28} {:<34} {:>9.{}f}{} {:>9.{}f}{} {:>+6.1f}% {:>15}  {}{}\n", c.row.source,
                       c.row.label, c.published_layout.layout.describe(), c.row.published, big ? 0 : 2, unit,
                       c.predicted, big ? 0 : 2, unit, 100 * c.relative_error,
                       fmt::format("{:.1f} ({:+.1f})", c.memory_gib(), c.headroom_gib()), best,
                       c.published_fits ? "" : "  [published layout predicted not to fit]");
      if (std::abs(c.relative_error) > 0.05) {
        std::string shares;
        for (const auto& [name, value] : terms_of(c.published_layout.time))
          if (value > 0.005 * c.published_layout.step_seconds())
            shares += fmt::format(" {} {:.0f}%", name, 100 * value / c.published_layout.step_seconds());
        s += fmt::format("{:<20}   off by {:+.1f}%; predicted step {:.3f}s:{}\n", "", 100 * c.relative_error,
                         c.published_layout.step_seconds(), shares);
      }
    }
    s += fmt::format("{}: mean |error| {:.2f}%, worst {:.2f}% over {} rows\n", g.group, 100 * g.mean, 100 * g.worst,
                     g.rows);
    if (g.mean > 0.02) {
      const auto terms = attribute_error(members);
      std::string line;
      for (size_t i = 0; i < terms.size() && i < 3; ++i)
        line += fmt::format("{}{} x{:.2f} -> mean {:.1f}%", i ? "; " : "", terms[i].term, terms[i].scale,
                            100 * terms[i].mean_after);
      s += fmt::format("  term most consistent with the error (one factor for the whole group): {}\n", line);
    }
    s += "\n";
  }
  s += "units: s = seconds per step, T = TFLOP/s per GPU counting recompute (Narayanan), M = model TFLOP/s per GPU "
       "(Megatron's count), t = tokens per second, g = tokens per second per GPU\n";
  for (const auto& a : published_assumptions()) s += "assumed: " + a + "\n";
  return s;
}

}  // namespace loom::planner
