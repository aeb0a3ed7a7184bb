// Gradient finalisation and the global norm on real Gloo groups: data-parallel averaging equals
// the single-process mean, sequence-parallel grads end identical across tensor ranks, the tied
// embedding copies end identical, and every distinct gradient counts once in the norm, for the
// plain (all-reduce) and distributed (reduce-scatter) layouts. Each worker computes its
// reference from every rank's seeded gradients itself.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <cmath>

#include "harness/multiprocess.h"
#include "harness/worker_groups.h"
#include "launch/env_rendezvous.h"
#include "runtime/process_groups.h"
#include "train/optim/grad_norm.h"
#include "train/optim/optimizer.h"

using namespace loom;
using namespace loom::train::optim;
using model::Param;
using model::ParamList;

namespace {

std::shared_ptr<runtime::ProcessGroups> make_groups() {
  return loom::test::worker_groups(test::env_int("T"), test::env_int("P"));
}

// Parameter kinds of the fake stage: 0 tensor-parallel weight, 1 sequence-parallel LayerNorm,
// 2 replicated weight, 3 word embedding (first stage), 4 tied output embedding (last stage).
const std::vector<int64_t> kShapes[5] = {{4, 3}, {5}, {6}, {8, 2}, {8, 2}};

std::vector<int> stage_kinds(int pp, int p) {
  std::vector<int> kinds = {0, 1, 2};
  if (pp == 0) kinds.push_back(3);
  if (pp == p - 1 && p > 1) kinds.push_back(4);
  return kinds;
}

at::Tensor local_grad(int rank, int kind) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + 17 * rank + kind);
  return at::randn(kShapes[kind], gen, at::kFloat);
}

model::ParamList stage_params(int pp, int p) {
  model::ParamList params;
  for (int kind : stage_kinds(pp, p)) {
    model::Param tp;
    const char* names[5] = {"w_tp", "ln", "rep", "emb", "emb_out"};
    tp.name = names[kind] + std::string(".") + std::to_string(pp);
    // Replicated values are the same on every tensor rank (seeded by stage and kind only);
    // the two embedding copies start equal, as the model builds them.
    auto gen = at::make_generator<at::CPUGeneratorImpl>(kind >= 3 ? 3 : 50 + 10 * pp + kind);
    tp.tensor = at::randn(kShapes[kind], gen, at::kFloat).set_requires_grad(true);
    tp.partition_dim = (kind == 0 || kind >= 3) ? 0 : -1;
    tp.sequence_parallel = kind == 1;
    tp.word_embedding = kind >= 3;
    tp.shared_duplicate = kind == 4;
    tp.weight_decay = kind != 1;
    params.push_back(tp);
  }
  return params;
}

struct Reference {
  const runtime::ParallelLayout& layout;
  int d() const { return layout.data_parallel(); }
  // Data-parallel mean of one kind at (tp, pp).
  at::Tensor dp_mean(int kind, int tp, int pp) const {
    at::Tensor sum = at::zeros(kShapes[kind], at::kDouble);
    for (int dp = 0; dp < d(); ++dp) sum += local_grad(layout.rank_of({tp, dp, pp}), kind).to(at::kDouble);
    return sum / d();
  }
  // The finalised gradient of `kind` at (tp, pp).
  at::Tensor expected(int kind, int tp, int pp) const {
    const int t = layout.tensor_parallel(), p = layout.pipeline_parallel();
    if (kind == 1) {
      at::Tensor s = at::zeros(kShapes[kind], at::kDouble);
      for (int r = 0; r < t; ++r) s += dp_mean(kind, r, pp);
      return s;
    }
    if (kind >= 3 && p > 1) return dp_mean(3, tp, 0) + dp_mean(4, tp, p - 1);
    return dp_mean(kind, tp, pp);
  }
  // Every distinct gradient once: TP-sharded ones on each tensor rank, replicated ones once,
  // the tied copy not at all.
  double norm() const {
    double sum_sq = 0;
    for (int pp = 0; pp < layout.pipeline_parallel(); ++pp)
      for (int tp = 0; tp < layout.tensor_parallel(); ++tp)
        for (int kind : stage_kinds(pp, layout.pipeline_parallel())) {
          bool counted = kind == 0 || kind == 3 || ((kind == 1 || kind == 2) && tp == 0);
          if (counted) sum_sq += expected(kind, tp, pp).pow(2).sum().item<double>();
        }
    return std::sqrt(sum_sq);
  }
};

}  // namespace

// Checks one layout (plain or distributed) on this rank.
void check_finalize(const std::shared_ptr<runtime::ProcessGroups>& g, bool distributed) {
  const auto c = g->coords();
  const int p = g->layout().pipeline_parallel();
  model::ParamList params = stage_params(c.pp, p);
  OptimizerOptions o;
  o.distributed = distributed;
  o.bucket_bytes = 48;  // 12 elements: many buckets, parameters straddling shard boundaries
  o.clip_grad = 0.0;
  auto opt = Optimizer::create(params, g, o);
  opt->zero_grad();
  std::vector<int> kinds = stage_kinds(c.pp, p);
  for (size_t i = 0; i < params.size(); ++i) params[i].tensor.mutable_grad() = local_grad(g->rank(), kinds[i]);
  opt->accumulate_grads();
  StepValues r = opt->step(1e-3).read();

  Reference ref{g->layout()};
  LOOM_WCHECK(!r.skipped);
  LOOM_WCHECK(std::abs(r.grad_norm - ref.norm()) <= 1e-5 * ref.norm(),
              "norm " + std::to_string(r.grad_norm) + " expected " + std::to_string(ref.norm()));

  // The finalised gradients: all of them (plain) or this rank's shard of every bucket.
  GradBuffer& buf = opt->grads();
  at::Tensor want = at::zeros_like(buf.data());
  for (size_t i = 0; i < params.size(); ++i)
    want.narrow(0, buf.offset(i), params[i].tensor.numel()).copy_(ref.expected(kinds[i], c.tp, c.pp).view(-1));
  const int d = g->data().size();
  for (size_t b = 0; b < buf.buckets().size(); ++b) {
    const auto& bucket = buf.buckets()[b];
    int64_t lo = bucket.offset, n = bucket.numel;
    if (distributed) {
      n /= d;
      lo += g->data().rank() * n;
    }
    LOOM_WCHECK(at::allclose(buf.data().narrow(0, lo, n), want.narrow(0, lo, n), 1e-5, 1e-6),
                "bucket " + std::to_string(b));
  }
  if (!distributed) {
    // Sequence-parallel grads and the updated LayerNorm weights are bitwise identical across
    // tensor ranks; the two embedding copies' grads are identical across the embedding group.
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].sequence_parallel && !params[i].word_embedding) continue;
      auto& group = params[i].sequence_parallel ? g->tensor() : g->embedding();
      for (const at::Tensor& t : {buf.main_grad(i), params[i].tensor.detach()}) {
        at::Tensor all = group.all_gather_dim0(t.reshape({1, -1}).contiguous());
        for (int m = 1; m < group.size(); ++m)
          LOOM_WCHECK(at::equal(all[m], all[0]), "(" + params[i].name + " differs across " + group.name() + ")");
      }
    }
  }
}

LOOM_WORKER("optim_finalize") {
  auto g = make_groups();
  check_finalize(g, false);
  check_finalize(g, true);
  g->world().barrier();
  g->shutdown();
}

TEST_CASE("gradient finalisation and norm: d=4, plain and distributed", "[train][optim][multiprocess]") {
  auto r = test::run_ranks("optim_finalize", 4, {{"T", "1"}, {"P", "1"}});
  REQUIRE(r.exit_code() == 0);
}

TEST_CASE("gradient finalisation and norm: t=2 p=2 d=2, plain and distributed", "[train][optim][multiprocess]") {
  auto r = test::run_ranks("optim_finalize", 8, {{"T", "2"}, {"P", "2"}});
  REQUIRE(r.exit_code() == 0);
}

// The reported bug: the tied embedding's two copies both counted gives 40 instead of 28.28;
// a replicated weight counted on every tensor rank inflates the norm the same way.
LOOM_WORKER("optim_norm_duplicates") {
  auto g = make_groups();
  const auto c = g->coords();
  model::ParamList params(1);
  params[0].tensor = at::zeros({2}, at::kFloat).set_requires_grad(true);
  std::vector<at::Tensor> local_grads(1);
  double want = 0, naive = 0;
  if (test::env_str("CASE") == "tied") {  // t=1, p=2
    params[0].name = c.pp == 0 ? "emb" : "emb_out";
    params[0].word_embedding = true;
    params[0].partition_dim = 0;
    params[0].shared_duplicate = c.pp == 1;
    local_grads[0] = c.pp == 0 ? at::tensor({12.0f, 5.0f}) : at::tensor({8.0f, 15.0f});  // sum (20, 20)
    want = std::sqrt(800.0);  // 28.28
    naive = 40.0;
  } else {  // t=2: a replicated weight with the same grad (3, 4) on both tensor ranks
    params[0].name = "rep";
    local_grads[0] = at::tensor({3.0f, 4.0f});
    model::Param tp;
    tp.name = "w_tp";
    tp.partition_dim = 0;
    tp.tensor = at::zeros({1}, at::kFloat).set_requires_grad(true);
    params.push_back(tp);
    local_grads.push_back(at::full({1}, c.tp == 0 ? 12.0f : 0.0f));
    want = 13.0;               // sqrt(25 + 144)
    naive = std::sqrt(194.0);  // 13.93
  }
  for (bool distributed : {false, true}) {
    for (size_t i = 0; i < params.size(); ++i) params[i].tensor.mutable_grad() = local_grads[i].clone();
    OptimizerOptions o;
    o.distributed = distributed;
    o.clip_grad = 0.0;
    auto opt = Optimizer::create(params, g, o);
    opt->accumulate_grads();
    StepValues r = opt->step(1e-3).read();
    LOOM_WCHECK(std::abs(r.grad_norm - want) < 1e-4, "norm " + std::to_string(r.grad_norm));
    std::vector<at::Tensor> all;
    for (size_t i = 0; i < params.size(); ++i) all.push_back(opt->grads().main_grad(i));
    float counted_twice = global_grad_norm(all, g->world()).item<float>();
    LOOM_WCHECK(std::abs(counted_twice - naive) < 1e-4, "naive norm " + std::to_string(counted_twice));
  }
  g->world().barrier();
  g->shutdown();
}

TEST_CASE("grad norm counts the tied embedding and tensor-replicated weights once", "[train][optim][multiprocess]") {
  auto tied = test::run_ranks("optim_norm_duplicates", 2, {{"T", "1"}, {"P", "2"}, {"CASE", "tied"}});
  REQUIRE(tied.exit_code() == 0);
  auto tp = test::run_ranks("optim_norm_duplicates", 2, {{"T", "2"}, {"P", "1"}, {"CASE", "tp"}});
  REQUIRE(tp.exit_code() == 0);
}
