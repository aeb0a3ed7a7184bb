// Pipeline schedules: the shape of the op order, and real multi-stage runs over Gloo whose
// gradients equal a single-process run of the same toy model.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <set>

#include "harness/multiprocess.h"
#include "launch/env_rendezvous.h"
#include "runtime/process_groups.h"
#include "train/pipeline_schedule.h"

using namespace loom;
using train::schedule_order;

TEST_CASE("1F1B order: p - r - 1 warm-up forwards and at most p - r stashed", "[schedule]") {
  const int p = 4, m = 8;
  for (int r = 0; r < p; ++r) {
    auto ops = schedule_order(p, r, m, 1, false);
    REQUIRE(ops.size() == 2 * m);
    int warm = 0;
    while (ops[warm].forward) ++warm;
    CHECK(warm == p - r);  // p - r - 1 warm-up forwards, then the first steady-state forward
    int stashed = 0, most = 0, fwd_mb = 0, bwd_mb = 0;
    for (const auto& op : ops) {
      if (op.forward) {
        CHECK(op.microbatch == fwd_mb++);
        most = std::max(most, ++stashed);
      } else {
        CHECK(op.microbatch == bwd_mb++);
        --stashed;
      }
    }
    CHECK(most == p - r);
  }
  CHECK(schedule_order(4, 0, 2, 1, false).size() == 4);  // m < p: warm-up capped at m
}

TEST_CASE("interleaved order: every (chunk, micro-batch) once each way, backward after forward",
          "[schedule]") {
  const int p = 2, v = 2, m = 4;
  for (int r = 0; r < p; ++r) {
    auto ops = schedule_order(p, r, m, v, false);
    REQUIRE(ops.size() == 2 * m * v);
    std::set<std::pair<int, int>> done_f, done_b;
    for (const auto& op : ops) {
      auto key = std::make_pair(op.chunk, op.microbatch);
      if (op.forward) {
        CHECK(done_f.insert(key).second);
      } else {
        CHECK(done_f.count(key) == 1);
        CHECK(done_b.insert(key).second);
      }
    }
    CHECK(done_b.size() == size_t(m * v));
  }
  CHECK_THROWS_WITH(schedule_order(4, 0, 6, 2, false), Catch::Contains("multiple of"));
}

namespace {

constexpr int kLayers = 8, kSeq = 4, kBatch = 2, kHidden = 8;

struct ToyModel {
  std::vector<at::Tensor> weights, biases;
  explicit ToyModel(uint64_t seed) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    for (int l = 0; l < kLayers; ++l) {
      weights.push_back(at::normal(0.0, 0.3, {kHidden, kHidden}, gen).requires_grad_(true));
      biases.push_back(at::normal(0.0, 0.1, {kHidden}, gen).requires_grad_(true));
    }
  }
  // Residual layers: y = x + tanh(x W + b). The residual add saves nothing for backward, so
  // a sent output's storage may be released, as in the GPT layers.
  at::Tensor run(at::Tensor x, int first, int last) const {
    for (int l = first; l < last; ++l) x = x + at::tanh(at::matmul(x, weights[l]) + biases[l]);
    return x;
  }
};

std::vector<at::Tensor> toy_inputs(int m) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(99);
  std::vector<at::Tensor> xs;
  for (int i = 0; i < m; ++i) xs.push_back(at::normal(0.0, 1.0, {kSeq, kBatch, kHidden}, gen));
  return xs;
}

at::Tensor toy_loss(const at::Tensor& y, int m) { return y.pow(2).mean() / m; }

}  // namespace

LOOM_WORKER("toy_pipeline") {
  at::set_num_threads(1);
  const int v = test::env_int("V"), m = test::env_int("M");
  runtime::ProcessGroupOptions opt;
  opt.layout.pp = test::env_int("P");
  auto groups = runtime::ProcessGroups::create(launch::rendezvous_from_env(), opt);
  auto& pipe = groups->pipeline_links();
  const int p = pipe.size(), r = pipe.rank();
  const int per_virtual = kLayers / (p * v);
  auto inputs = toy_inputs(m);

  // Reference: the whole model in this process, micro-batches accumulated in order.
  ToyModel ref(7);
  at::Tensor ref_loss = at::zeros({});
  for (int i = 0; i < m; ++i) {
    auto loss = toy_loss(ref.run(inputs[i], 0, kLayers), m);
    loss.backward();
    ref_loss += loss.detach();
  }

  ToyModel model(7);
  train::ScheduleConfig cfg;
  cfg.num_microbatches = m;
  cfg.virtual_stages = v;
  cfg.activation_shape = {kSeq, kBatch, kHidden};
  auto result = train::run_pipeline_schedule(cfg, pipe, [&](int chunk, int mb, const at::Tensor& in) {
    const int vs = chunk * p + r;  // virtual stage
    at::Tensor x = vs == 0 ? inputs[mb] : in;
    at::Tensor y = model.run(x, vs * per_virtual, (vs + 1) * per_virtual);
    return vs == p * v - 1 ? toy_loss(y, m) : y;
  });

  for (int c = 0; c < v; ++c) {
    const int vs = c * p + r;
    for (int l = vs * per_virtual; l < (vs + 1) * per_virtual; ++l) {
      LOOM_WCHECK(model.weights[l].grad().defined(), "layer " + std::to_string(l));
      LOOM_WCHECK(at::allclose(model.weights[l].grad(), ref.weights[l].grad(), 1e-5, 1e-7),
                  "weight grad of layer " + std::to_string(l));
      LOOM_WCHECK(at::allclose(model.biases[l].grad(), ref.biases[l].grad(), 1e-5, 1e-7),
                  "bias grad of layer " + std::to_string(l));
    }
  }
  if (r == p - 1) {
    LOOM_WCHECK(int(result.losses.size()) == m);
    at::Tensor total = at::zeros({});
    for (auto& l : result.losses) total += l;
    LOOM_WCHECK(at::allclose(total, ref_loss, 1e-6, 0), "loss");
  } else {
    LOOM_WCHECK(result.losses.empty());
  }
  LOOM_WCHECK(result.stats.forwards == m * v && result.stats.backwards == m * v);
  if (v == 1 && r == 0) {
    // 1F1B: stage 0 never holds more than p micro-batches (exactly p once m >= p).
    LOOM_WCHECK(result.stats.max_stashed == std::min(p, m),
                "stashed " + std::to_string(result.stats.max_stashed));
  }
  groups->world().barrier();
  groups->shutdown();
}

TEST_CASE("pipeline schedules give the single-process gradients", "[schedule][multiprocess]") {
  struct Case { int p, v, m; };
  for (auto c : {Case{2, 1, 4}, Case{4, 1, 8}, Case{4, 1, 2}, Case{2, 2, 4}, Case{4, 2, 8}}) {
    INFO("p=" << c.p << " v=" << c.v << " m=" << c.m);
    auto r = test::run_ranks("toy_pipeline", c.p, {{"P", std::to_string(c.p)},
                             {"V", std::to_string(c.v)}, {"M", std::to_string(c.m)}});
    CHECK(r.exit_code() == 0);
  }
}
