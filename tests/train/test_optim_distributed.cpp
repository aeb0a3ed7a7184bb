// The distributed optimizer (ZeRO-1) against the single-process reference: the same parameters,
// norms and state as a plain AdamW fed the data-parallel mean of every rank's gradients, for
// d = 2 and 4, fp32 and bf16; a bit-exact checkpoint round trip of the sharded state; and an
// overflow on one rank skipping the step on all of them.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <cmath>

#include "harness/multiprocess.h"
#include "harness/worker_groups.h"
#include "launch/env_rendezvous.h"
#include "runtime/process_groups.h"
#include "train/optim/distributed_optimizer.h"
#include "train/optim/lr_schedule.h"
#include "train/optim/optimizer.h"

using namespace loom;
using namespace loom::train::optim;
using model::Param;
using model::ParamList;

namespace {

std::shared_ptr<runtime::ProcessGroups> make_groups() {
  return loom::test::worker_groups(1);
}

// A fake model: a list of random tensors (odd sizes so shards cut through parameters).
model::ParamList fake_model(at::ScalarType dtype, uint64_t seed) {
  const std::vector<std::vector<int64_t>> shapes = {{7, 3}, {5}, {4, 4}, {3}, {9, 2}, {1}};
  model::ParamList params;
  for (size_t i = 0; i < shapes.size(); ++i) {
    model::Param p;
    p.name = "p" + std::to_string(i);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + i);
    p.tensor = at::randn(shapes[i], gen, at::kFloat).to(dtype).set_requires_grad(true);
    p.weight_decay = i % 2 == 0;
    params.push_back(p);
  }
  return params;
}

// Gradient of parameter i on `rank` for micro-batch `micro` of step `step`.
at::Tensor local_grad(const model::Param& p, size_t i, int rank, int step, int micro) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100000 + 1000 * step + 100 * micro + 10 * rank + i);
  return at::randn(p.tensor.sizes(), gen, at::kFloat).mul(0.3);
}

constexpr int kMicro = 2;

void feed_local(Optimizer& opt, int rank, int step) {
  opt.zero_grad();
  for (int micro = 0; micro < kMicro; ++micro) {
    const auto& params = opt.params();
    for (size_t i = 0; i < params.size(); ++i)
      params[i].tensor.mutable_grad() = local_grad(params[i], i, rank, step, micro).to(params[i].tensor.scalar_type());
    opt.accumulate_grads();
  }
}

// The single-process reference sees the mean over ranks of each rank's summed micro-batches.
void feed_mean(Optimizer& opt, int world, int step) {
  opt.zero_grad();
  const auto& params = opt.params();
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor sum = at::zeros(params[i].tensor.sizes(), at::kDouble);
    for (int r = 0; r < world; ++r)
      for (int micro = 0; micro < kMicro; ++micro)
        sum += local_grad(params[i], i, r, step, micro).to(params[i].tensor.scalar_type()).to(at::kDouble);
    opt.grads().main_grad(i).copy_(sum / world);
  }
}

OptimizerOptions options(bool distributed) {
  OptimizerOptions o;
  o.adamw = AdamWConfig{0.9, 0.95, 1e-8, 0.1};
  o.distributed = distributed;
  o.bucket_bytes = 40;  // 10 elements per bucket
  o.clip_grad = 1.0;    // the gradients here have norms of about 2: clipping is active
  return o;
}

LrScheduleConfig schedule() {
  LrScheduleConfig s;
  s.lr = 1e-2;
  s.min_lr = 1e-3;
  s.warmup_steps = 1;
  s.max_steps = 5;
  return s;
}

void check_close(const at::Tensor& got, const at::Tensor& want, double rtol, double atol, const std::string& what) {
  LOOM_WCHECK(at::allclose(got.to(at::kFloat), want.to(at::kFloat), rtol, atol),
              "(" + what + ": max diff " + std::to_string((got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<float>()) + ")");
}

}  // namespace

// Runs the comparison for one parameter dtype on this rank.
void compare_with_reference(const std::shared_ptr<runtime::ProcessGroups>& g, at::ScalarType dtype) {
  const int rank = g->rank(), world = g->layout().world_size();
  auto solo = runtime::ProcessGroups::single_process();
  auto dist = Optimizer::create(fake_model(dtype, 1), g, options(true));
  auto plain = Optimizer::create(fake_model(dtype, 1), g, options(false));
  auto ref = Optimizer::create(fake_model(dtype, 1), solo, options(false));
  LOOM_WCHECK(dynamic_cast<DistributedOptimizer*>(dist.get()) != nullptr);
  // ZeRO-1 memory: this rank holds 1/d of the padded buffer.
  LOOM_WCHECK(dynamic_cast<DistributedOptimizer&>(*dist).shard_numel() * world == dist->grads().data().numel());

  // Tolerances: the reductions' rounding (fp32); bf16 parameters may round to neighbours.
  const double rtol = dtype == at::kFloat ? 1e-6 : 1e-2, atol = dtype == at::kFloat ? 1e-7 : 1e-2;
  OptimizerState saved;
  constexpr int kSteps = 4;
  for (int step = 0; step < kSteps; ++step) {
    if (step == 2) saved = dist->state_dict();
    const double lr = lr_at(schedule(), step);
    feed_local(*dist, rank, step);
    feed_local(*plain, rank, step);
    feed_mean(*ref, world, step);
    StepValues rd = dist->step(lr).read(), rp = plain->step(lr).read(), rr = ref->step(lr).read();
    LOOM_WCHECK(rr.clip_coefficient < 1.0, "(clipping should be active)");
    LOOM_WCHECK(std::abs(rd.grad_norm - rr.grad_norm) <= 1e-6 * rr.grad_norm, "dist norm " + std::to_string(rd.grad_norm) + " vs " + std::to_string(rr.grad_norm));
    LOOM_WCHECK(std::abs(rp.grad_norm - rr.grad_norm) <= 1e-6 * rr.grad_norm, "plain norm");
    for (size_t i = 0; i < ref->params().size(); ++i) {
      const at::Tensor want = ref->params()[i].tensor.detach();
      check_close(dist->params()[i].tensor.detach(), want, rtol, atol, "dist " + ref->params()[i].name);
      check_close(plain->params()[i].tensor.detach(), want, rtol, atol, "plain " + ref->params()[i].name);
    }
  }
  // The gathered sharded state equals the reference state (fp32 main weights and moments).
  OptimizerState sd = dist->state_dict(), sr = ref->state_dict();
  LOOM_WCHECK(sd.values == sr.values);
  for (const auto& [key, t] : sr.tensors) check_close(sd.tensors.at(key), t, 1e-5, 1e-7, key);

  // Checkpoint round trip: a fresh distributed optimizer on other values, restored from the
  // state after step 2, repeats steps 2 and 3 bit for bit.
  auto again = Optimizer::create(fake_model(dtype, 77), g, options(true));
  again->load_state_dict(saved);
  for (int step = 2; step < kSteps; ++step) {
    feed_local(*again, rank, step);
    again->step(lr_at(schedule(), step));
  }
  for (size_t i = 0; i < again->params().size(); ++i)
    LOOM_WCHECK(at::equal(again->params()[i].tensor.detach(), dist->params()[i].tensor.detach()), "(restored " + again->params()[i].name + ")");
  OptimizerState sa = again->state_dict();
  for (const auto& [key, t] : sd.tensors) LOOM_WCHECK(at::equal(sa.tensors.at(key), t), "(restored state " + key + ")");
}

LOOM_WORKER("optim_dist_vs_plain") {
  auto g = make_groups();
  compare_with_reference(g, at::kFloat);
  compare_with_reference(g, at::kBFloat16);
  g->world().barrier();
  g->shutdown();
}

TEST_CASE("distributed optimizer equals the single-process reference, d=2 and d=4, fp32 and bf16", "[train][optim][multiprocess]") {
  for (int world : {2, 4}) {
    INFO("d=" << world);
    auto r = test::run_ranks("optim_dist_vs_plain", world);
    REQUIRE(r.exit_code() == 0);
  }
}

// fp16: an inf on one rank's gradient makes every rank skip (unchanged parameters and state)
// and back off the scale; the next clean step updates everywhere.
LOOM_WORKER("optim_overflow") {
  auto g = make_groups();
  const int rank = g->rank();
  for (bool distributed : {false, true}) {
    auto opt = Optimizer::create(fake_model(at::kHalf, 5), g, options(distributed));
    LossScalerConfig sc;
    sc.initial_scale = 256;
    sc.hysteresis = 1;
    LossScaler scaler(sc);
    feed_local(*opt, rank, 0);
    if (rank == 1) opt->grads().main_grad(3)[1] = INFINITY;  // rank 0's own gradients are finite
    OptimizerState before = opt->state_dict();
    std::vector<at::Tensor> params_before;
    for (const auto& p : opt->params()) params_before.push_back(p.tensor.detach().clone());
    StepValues r = opt->step(1e-2, &scaler).read();
    LOOM_WCHECK(r.skipped && std::isnan(r.grad_norm));
    LOOM_WCHECK(scaler.scale() == 128 && r.loss_scale == 128);
    OptimizerState after = opt->state_dict();
    LOOM_WCHECK(after.values == before.values);
    for (const auto& [key, t] : before.tensors) LOOM_WCHECK(at::equal(after.tensors.at(key), t), "(" + key + ")");
    for (size_t i = 0; i < params_before.size(); ++i)
      LOOM_WCHECK(at::equal(opt->params()[i].tensor.detach(), params_before[i]));
    feed_local(*opt, rank, 1);
    r = opt->step(1e-2, &scaler).read();
    LOOM_WCHECK(!r.skipped && opt->step_count() == 1 && scaler.scale() == 128);
    bool changed = false;
    for (size_t i = 0; i < params_before.size(); ++i)
      changed |= !at::equal(opt->params()[i].tensor.detach(), params_before[i]);
    LOOM_WCHECK(changed);
  }
  g->world().barrier();
  g->shutdown();
}

TEST_CASE("an overflow on one rank skips the step on every rank", "[train][optim][multiprocess]") {
  auto r = test::run_ranks("optim_overflow", 2);
  REQUIRE(r.exit_code() == 0);
}
