// The planner against published results (docs/planner.md, "Validation"): the fitted A100 group
// (Korthikanti et al. 2022 iteration times, Narayanan et al. 2021 TFLOP/s per GPU) and three
// held-out groups no constant was chosen on (the Megatron-LM README's H100 weak scaling, the
// NeMo-Megatron-Launcher README's 2022-07 5B scaling table, torchtitan's Llama 3 throughput).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <set>

#include "planner/validation.h"

using namespace loom::planner;

namespace {
std::map<std::string, GroupError> by_group(const std::vector<RowCheck>& checks) {
  std::map<std::string, GroupError> out;
  for (const auto& g : group_errors(checks)) out[g.group] = g;
  return out;
}
}  // namespace

TEST_CASE("published results: the fitted and the held-out groups within their bounds", "[planner]") {
  const auto checks = check_published(true);
  std::cout << format_checks(checks);
  REQUIRE(checks.size() == 18 + 9 + 7 + 4);
  for (const auto& c : checks) {
    INFO(c.row.source << " " << c.row.label);
    // The published layout must fit in memory by the planner's own model; not checked for the
    // FSDP rows (torchtitan): FSDP shards the parameters and gradients too, the planner's
    // distributed optimizer only the optimizer state (docs/planner.md, "Held-out group 3").
    if (c.row.group != "held-out Llama") CHECK(c.published_fits);
    // The planner's best layout for the same model, GPUs, batch and software is at least as
    // fast as a published layout that fits.
    REQUIRE(c.planner_best.step_seconds() > 0);
    if (c.published_fits) CHECK(c.planner_best.step_seconds() <= c.published_layout.step_seconds() * (1 + 1e-12));
    CHECK(c.planner_best.fits);
  }
  auto groups = by_group(checks);
  REQUIRE(groups.size() == 4);
  CHECK(groups["fitted"].rows == 18);
  CHECK(groups["fitted"].mean <= 0.04);
  CHECK(groups["fitted"].worst <= 0.10);
  CHECK(groups["held-out H100"].rows == 9);
  // Issue 17's targets for the held-out groups (docs/planner.md, "Validation").
  CHECK(groups["held-out H100"].mean <= 0.10);
  CHECK(groups["held-out H100"].worst <= 0.20);
  CHECK(groups["held-out 5B"].rows == 7);
  CHECK(groups["held-out 5B"].worst <= 0.06);
  // Held-out group 3, torchtitan's Llama 3 FSDP throughput, misses the held-out targets (mean
  // 47%, worst 80%: docs/planner.md, "Held-out group 3", says why). Its rows' errors are the
  // figures documented there, to 0.1 point, so that a model change shows up in the docs too.
  CHECK(groups["held-out Llama"].rows == 4);
  const double documented[] = {0.257, 0.072, 0.748, 0.803};
  int i = 0;
  for (const auto& c : checks) {
    if (c.row.group != "held-out Llama") continue;
    INFO(c.row.label);
    CHECK(c.relative_error == Approx(documented[i++]).margin(0.001));
  }
}

TEST_CASE("published rows carry the configurations and numbers of their sources", "[planner]") {
  const auto rows = published_rows();
  std::set<std::string> sources;
  for (const auto& r : rows) {
    sources.insert(r.source);
    CHECK(r.gpus % (r.layout.tp * r.layout.pp) == 0);
    CHECK(r.shape.num_layers % r.layout.pp == 0);
  }
  CHECK(sources.size() == 6);
  CHECK(rows[2].label == "175B full recompute");
  CHECK(rows[2].published == 18.13);
  CHECK(rows[2].layout.vp == 3);
  CHECK(rows[17].shape.hidden_size == 25600);
  CHECK(rows[17].published == 163);
  // Megatron-LM README model table: 462B = 112 layers, h 18432, 144 heads, TP 8, PP 16, 6144 GPUs.
  const PublishedRow& big = rows[18 + 8];
  CHECK(big.gpu == "H100");
  CHECK(big.published == 459.9);
  CHECK((big.shape.num_layers == 112 && big.shape.hidden_size == 18432 && big.shape.num_attention_heads == 144));
  CHECK((big.layout.tp == 8 && big.layout.pp == 16 && big.gpus == 6144 && big.setup.global_batch == 3072));
  CHECK((big.shape.seq_length == 4096 && big.shape.vocab_size == 131072 && big.setup.fused_attention));
  CHECK(big.gpus / (big.layout.tp * big.layout.pp) == 48);
  // NeMo launcher 2022-07: 20 nodes, 731,791 tokens/s; TP 2, micro-batch 2, global batch 1440.
  const PublishedRow& five = rows[18 + 9 + 6];
  CHECK(five.published == 731791);
  CHECK((five.gpus == 160 && five.layout.tp == 2 && five.layout.micro_batch == 2 && five.setup.global_batch == 1440));
  CHECK_FALSE(five.setup.fused_attention);
  // torchtitan's H100 benchmark, Table 1: Llama 3.1 8B, FSDP on 8 GPUs, local batch 2: 5,762 tokens/s per GPU.
  const PublishedRow& titan = rows[18 + 9 + 7 + 2];
  CHECK(titan.published == 5762);
  CHECK((titan.gpu == "H100" && titan.gpus == 8 && titan.layout.micro_batch == 2 && titan.setup.global_batch == 16));
  CHECK(titan.shape.parameter_count() == 8030261248.0);
  CHECK((titan.shape.seq_length == 8192 && titan.setup.fused_attention && titan.layout.distributed_optimizer));
  CHECK(published_assumptions().size() == 3);
}

TEST_CASE("error attribution finds a term scaled in every row of a group", "[planner]") {
  // Rows whose published figures are the prediction with the attention term doubled: the
  // attribution must name attention with a factor near 2 and a near-zero remaining error.
  auto checks = check_published(false);
  std::vector<RowCheck> h100;
  for (const auto& c : checks)
    if (c.row.group == "held-out H100") h100.push_back(c);
  REQUIRE(h100.size() == 9);
  for (auto& c : h100) {
    const double step = c.published_layout.step_seconds() + c.published_layout.time.attention;
    c.row.published = c.row.shape.model_flops_per_sample() * c.row.setup.global_batch / step / c.row.gpus / 1e12;
  }
  const auto terms = attribute_error(h100);
  REQUIRE_FALSE(terms.empty());
  CHECK(terms.front().term == "attention");
  CHECK(terms.front().scale == Approx(2.0).epsilon(0.01));
  CHECK(terms.front().mean_after < 0.002);
}
