// The optimizer step in one process: gradient buffer layout and fp32 accumulation, clipping,
// weight-decay exclusion, bf16 master weights, fp16 overflow skipping, and bit-exact state
// round trips.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <cmath>

#include "config/derived.h"
#include "config/recipe.h"
#include "runtime/process_groups.h"
#include "train/optim/adamw.h"
#include "train/optim/grad_norm.h"
#include "train/optim/optimizer.h"

using namespace loom;
using namespace loom::train::optim;
using model::Param;
using model::ParamList;

namespace {

at::Tensor seeded_randn(std::vector<int64_t> shape, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen, at::kFloat);
}

// A fake model: a few tensors of different shapes; "*.bias" and "*.ln" get no weight decay.
model::ParamList fake_model(at::ScalarType dtype, uint64_t seed = 7) {
  const std::vector<std::pair<std::string, std::vector<int64_t>>> specs = {
      {"emb.weight", {6, 4}}, {"fc.weight", {5, 4}}, {"fc.bias", {5}}, {"ln", {3}}, {"out.weight", {2, 5}}};
  model::ParamList params;
  for (size_t i = 0; i < specs.size(); ++i) {
    model::Param p;
    p.name = specs[i].first;
    p.tensor = seeded_randn(specs[i].second, seed + i).to(dtype).set_requires_grad(true);
    p.weight_decay = p.name.find("bias") == std::string::npos && p.name != "ln";
    params.push_back(p);
  }
  return params;
}

std::vector<at::Tensor> fake_grads(const model::ParamList& params, uint64_t seed, double scale = 1.0) {
  std::vector<at::Tensor> g;
  for (size_t i = 0; i < params.size(); ++i)
    g.push_back(seeded_randn(params[i].tensor.sizes().vec(), seed * 1000 + i).mul(scale));
  return g;
}

void set_grads(const model::ParamList& params, const std::vector<at::Tensor>& grads) {
  for (size_t i = 0; i < params.size(); ++i)
    params[i].tensor.mutable_grad() = grads[i].to(params[i].tensor.scalar_type());
}

OptimizerOptions options(double clip = 0.0) {
  OptimizerOptions o;
  o.adamw = AdamWConfig{0.9, 0.95, 1e-8, 0.1};
  o.clip_grad = clip;
  o.bucket_bytes = 40;  // several buckets even for this small model
  return o;
}

std::shared_ptr<runtime::ProcessGroups> solo() { return runtime::ProcessGroups::single_process(); }

bool states_equal(const OptimizerState& a, const OptimizerState& b) {
  if (a.values != b.values || a.tensors.size() != b.tensors.size()) return false;
  for (const auto& [k, t] : a.tensors) {
    auto it = b.tensors.find(k);
    if (it == b.tensors.end() || !at::equal(t, it->second)) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("gradient buffer: backprop order, buckets, padding, fp32 accumulation", "[train][optim]") {
  auto params = fake_model(at::kBFloat16);
  GradBufferOptions o;
  o.bucket_bytes = 64;  // 16 elements
  o.pad_multiple = 4;
  GradBuffer buf(params, o);
  // Reverse order: out.weight (10) first, then ln (3) → 13 ≥ 16? no; + fc.bias (5) = 18 closes.
  REQUIRE(buf.offset(4) == 0);
  REQUIRE(buf.offset(3) == 10);
  REQUIRE(buf.offset(2) == 13);
  REQUIRE(buf.buckets().size() == 3);
  CHECK(buf.buckets()[0].numel == 20);  // 18 padded to a multiple of 4
  CHECK(buf.buckets()[0].params == std::vector<size_t>{4, 3, 2});
  CHECK(buf.offset(1) == 20);           // fc.weight 20 closes bucket 1
  CHECK(buf.buckets()[1].numel == 20);
  CHECK(buf.offset(0) == 40);
  CHECK(buf.buckets()[2].numel == 24);
  CHECK(buf.data().numel() == 64);
  CHECK(buf.data().scalar_type() == at::kFloat);

  // Two micro-batches of bf16 grads accumulate exactly in fp32.
  auto g1 = fake_grads(params, 1), g2 = fake_grads(params, 2);
  set_grads(params, g1);
  buf.accumulate();
  CHECK_FALSE(params[0].tensor.grad().defined());
  set_grads(params, g2);
  buf.accumulate();
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor want = g1[i].to(at::kBFloat16).to(at::kFloat) + g2[i].to(at::kBFloat16).to(at::kFloat);
    CHECK(at::equal(buf.main_grad(i), want));
  }
  buf.zero();
  CHECK(buf.data().abs().sum().item<float>() == 0.0f);

  model::ParamList dup = {params[0], params[0]};
  dup[1].name = "again";
  CHECK_THROWS_WITH(GradBuffer(dup), Catch::Contains("same tensor"));
}

TEST_CASE("step: global norm, clipping, and no decay where weight_decay is false", "[train][optim]") {
  auto params = fake_model(at::kFloat);
  std::vector<at::Tensor> start;
  for (auto& p : params) start.push_back(p.tensor.detach().clone());
  auto grads = fake_grads(params, 3, 10.0);
  double sum_sq = 0;
  for (auto& g : grads) sum_sq += g.to(at::kDouble).pow(2).sum().item<double>();
  const double norm = std::sqrt(sum_sq);
  const double max_norm = norm / 4;

  auto opt = Optimizer::create(params, solo(), options(max_norm));
  opt->zero_grad();
  set_grads(params, grads);
  opt->accumulate_grads();
  StepValues r = opt->step(1e-2).read();
  CHECK_FALSE(r.skipped);
  CHECK(r.grad_norm == Approx(norm).epsilon(1e-6));
  CHECK(r.clip_coefficient == Approx(max_norm / (double(r.grad_norm) + 1e-6)).epsilon(1e-12));
  CHECK(r.clip_coefficient == Approx(0.25).epsilon(1e-6));
  CHECK(opt->step_count() == 1);
  // The gradients were clipped in place; the update is AdamW on the clipped gradients.
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor clipped = grads[i] * r.clip_coefficient;
    CHECK(at::allclose(opt->grads().main_grad(i), clipped, 1e-6, 1e-7));
    at::Tensor p = start[i].clone(), m = at::zeros_like(p), v = at::zeros_like(p);
    adamw_update(p, opt->grads().main_grad(i), m, v, 1, 1e-2, options().adamw, params[i].weight_decay);
    CHECK(at::equal(params[i].tensor.detach(), p));
  }

  // Zero gradients: only weight decay moves parameters, and only those with weight_decay.
  opt->zero_grad();
  for (auto& p : params) p.tensor.mutable_grad() = at::zeros_like(p.tensor);
  opt->accumulate_grads();
  std::vector<at::Tensor> before;
  for (auto& p : params) before.push_back(p.tensor.detach().clone());
  auto state = opt->state_dict();
  // Reset the moments so the update is decay alone.
  for (auto& [k, t] : state.tensors)
    if (k.rfind("exp_avg", 0) == 0) t.zero_();
  opt->load_state_dict(state);
  opt->step(1e-2);
  for (size_t i = 0; i < params.size(); ++i) {
    INFO(params[i].name);
    if (params[i].weight_decay)
      CHECK(at::allclose(params[i].tensor.detach(), before[i] * (1 - 1e-2 * 0.1), 0, 1e-7));
    else
      CHECK(at::equal(params[i].tensor.detach(), before[i]));
  }
}

TEST_CASE("bf16 parameters with fp32 main weights track an fp32 run", "[train][optim]") {
  auto p32 = fake_model(at::kFloat);
  auto p16 = fake_model(at::kBFloat16);
  // Start both from the same (bf16-representable) values.
  for (size_t i = 0; i < p32.size(); ++i) p32[i].tensor.detach().copy_(p16[i].tensor.detach());
  auto o32 = Optimizer::create(p32, solo(), options(1.0));
  auto o16 = Optimizer::create(p16, solo(), options(1.0));
  for (int step = 0; step < 20; ++step) {
    for (int micro = 0; micro < 2; ++micro) {
      auto g = fake_grads(p32, 10 + step * 2 + micro);
      set_grads(p32, g);
      set_grads(p16, g);
      o32->accumulate_grads();
      o16->accumulate_grads();
    }
    auto r32 = o32->step(1e-2).read(), r16 = o16->step(1e-2).read();
    CHECK(r16.grad_norm == Approx(r32.grad_norm).epsilon(1e-2));
    o32->zero_grad();
    o16->zero_grad();
  }
  auto s16 = o16->state_dict();
  for (size_t i = 0; i < p32.size(); ++i) {
    INFO(p32[i].name);
    at::Tensor a = p32[i].tensor.detach(), b = p16[i].tensor.detach().to(at::kFloat);
    // bf16 has 8 significant bits: within a few bf16 ulps of the fp32 run.
    CHECK(at::allclose(b, a, 2e-2, 1e-2));
    // The bf16 parameter is the rounded fp32 main weight.
    CHECK(at::equal(p16[i].tensor.detach(), s16.tensors.at("main/" + p16[i].name).to(at::kBFloat16)));
    CHECK_FALSE(at::equal(b, a));  // the two runs are genuinely different precisions
  }
}

TEST_CASE("fp16: an overflow skips the step and backs off the scale, clean steps unscale", "[train][optim]") {
  auto params = fake_model(at::kHalf);
  auto ref_params = fake_model(at::kHalf);
  LossScalerConfig sc;
  sc.initial_scale = 1024;
  sc.hysteresis = 2;
  sc.growth_interval = 2;
  LossScaler scaler(sc);
  auto opt = Optimizer::create(params, solo(), options(1.0));
  auto ref = Optimizer::create(ref_params, solo(), options(1.0));  // unscaled reference

  auto clean_step = [&](uint64_t seed) {
    auto g = fake_grads(params, seed);
    std::vector<at::Tensor> scaled;
    for (auto& t : g) scaled.push_back(t * scaler.scale());
    set_grads(params, scaled);
    opt->accumulate_grads();
    set_grads(ref_params, g);
    ref->accumulate_grads();
    auto r = opt->step(1e-2, &scaler).read();
    auto rr = ref->step(1e-2).read();
    opt->zero_grad();
    ref->zero_grad();
    CHECK_FALSE(r.skipped);
    CHECK(r.grad_norm == Approx(rr.grad_norm).epsilon(1e-3));
  };
  auto overflow_step = [&](uint64_t seed, float bad) {
    auto g = fake_grads(params, seed);
    g[2][1] = bad;
    set_grads(params, g);
    opt->accumulate_grads();
    auto before_state = opt->state_dict();
    std::vector<at::Tensor> before;
    for (auto& p : params) before.push_back(p.tensor.detach().clone());
    auto r = opt->step(1e-2, &scaler).read();
    opt->zero_grad();
    CHECK(r.skipped);
    CHECK(std::isnan(r.grad_norm));
    CHECK(opt->step_count() == before_state.values["step"].get<int64_t>());
    CHECK(states_equal(opt->state_dict(), before_state));
    for (size_t i = 0; i < params.size(); ++i) CHECK(at::equal(params[i].tensor.detach(), before[i]));
  };

  clean_step(1);
  overflow_step(2, INFINITY);
  CHECK(scaler.scale() == 1024);  // hysteresis 2: first overflow tolerated
  overflow_step(3, NAN);
  CHECK(scaler.scale() == 512);
  clean_step(4);
  clean_step(5);
  CHECK(scaler.scale() == 1024);  // grew after growth_interval = 2 clean steps
  CHECK(opt->step_count() == 3);
  for (size_t i = 0; i < params.size(); ++i) {
    // fp16 parameters round the same fp32 main weights up to the unscaling's rounding.
    CHECK(at::allclose(params[i].tensor.detach().to(at::kFloat), ref_params[i].tensor.detach().to(at::kFloat), 1e-3, 1e-3));
  }
}

TEST_CASE("state round trip: save, restore into a fresh optimizer, continue bit for bit", "[train][optim]") {
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    INFO(c10::toString(dtype));
    auto pa = fake_model(dtype);
    auto oa = Optimizer::create(pa, solo(), options(0.5));
    auto run_step = [](Optimizer& o, const model::ParamList& p, uint64_t seed) {
      o.zero_grad();
      set_grads(p, fake_grads(p, seed));
      o.accumulate_grads();
      return o.step(3e-3);
    };
    run_step(*oa, pa, 1);
    run_step(*oa, pa, 2);
    OptimizerState saved = oa->state_dict();
    run_step(*oa, pa, 3);
    run_step(*oa, pa, 4);

    auto pb = fake_model(dtype, /*seed=*/99);  // different values: the restore must set them
    auto ob = Optimizer::create(pb, solo(), options(0.5));
    ob->load_state_dict(saved);
    CHECK(ob->step_count() == 2);
    run_step(*ob, pb, 3);
    run_step(*ob, pb, 4);
    for (size_t i = 0; i < pa.size(); ++i) CHECK(at::equal(pa[i].tensor.detach(), pb[i].tensor.detach()));
    CHECK(states_equal(oa->state_dict(), ob->state_dict()));
  }
  auto p = fake_model(at::kFloat);
  auto o = Optimizer::create(p, solo(), options());
  auto s = o->state_dict();
  s.tensors.erase("exp_avg/fc.bias");
  CHECK_THROWS_WITH(o->load_state_dict(s), Catch::Contains("exp_avg/fc.bias"));
  s = o->state_dict();
  s.tensors["main/ln"] = at::zeros({4});
  CHECK_THROWS_WITH(o->load_state_dict(s), Catch::Contains("main/ln") && Catch::Contains("shape"));
}

TEST_CASE("grad-norm counting rule", "[train][optim]") {
  model::Param tp, rep, dup;
  tp.partition_dim = 0;
  dup.shared_duplicate = true;
  dup.partition_dim = 0;
  CHECK(counts_in_grad_norm(tp, 0));
  CHECK(counts_in_grad_norm(tp, 1));
  CHECK(counts_in_grad_norm(rep, 0));
  CHECK_FALSE(counts_in_grad_norm(rep, 1));
  CHECK_FALSE(counts_in_grad_norm(dup, 0));
  const auto coef = [](float norm, double max_norm) {
    return clip_coefficient(at::full({}, norm, at::kFloat), max_norm).item<double>();
  };
  CHECK(coef(10.0f, 1.0) == 1.0 / (10.0 + 1e-6));  // the float64 formula, exactly
  CHECK(coef(0.5f, 1.0) == 1.0);
  CHECK(coef(10.0f, 0.0) == 1.0);
  CHECK(coef(NAN, 1.0) == 1.0);
  CHECK(coef(INFINITY, 1.0) == 1.0);
}

TEST_CASE("without a loss scaler a non-finite gradient norm skips the update", "[train][optim]") {
  auto params = fake_model(at::kFloat);
  auto opt = Optimizer::create(params, solo(), options(1.0));
  std::vector<at::Tensor> before;
  for (auto& p : params) before.push_back(p.tensor.detach().clone());
  auto g = fake_grads(params, 4);
  g[1][0][0] = NAN;
  set_grads(params, g);
  opt->accumulate_grads();
  StepValues r = opt->step(1e-2).read();
  CHECK(r.skipped);
  CHECK(std::isnan(r.grad_norm));
  CHECK(opt->step_count() == 0);
  for (size_t i = 0; i < params.size(); ++i) CHECK(at::equal(params[i].tensor.detach(), before[i]));
}

TEST_CASE("optimizer names and construction errors", "[train][optim]") {
  // The run's choice is the recipe's (config::uses_distributed_optimizer, what optimizer_options reads).
  config::Recipe recipe;
  recipe.model.optim.name = config::OptimizerName::kDistributedFusedAdam;
  CHECK(config::uses_distributed_optimizer(recipe));
  recipe.model.optim.name = config::OptimizerName::kFusedAdam;
  CHECK_FALSE(config::uses_distributed_optimizer(recipe));
  recipe.model.use_distributed_optimizer = true;
  CHECK(config::uses_distributed_optimizer(recipe));
  auto mixed = fake_model(at::kFloat);
  mixed[2].tensor = mixed[2].tensor.detach().to(at::kBFloat16).set_requires_grad(true);
  auto o = options();
  o.distributed = true;
  CHECK_THROWS_WITH(Optimizer::create(mixed, solo(), o), Catch::Contains("fc.bias") && Catch::Contains("one dtype"));
  auto twice = fake_model(at::kFloat);
  twice[1].name = twice[0].name;
  CHECK_THROWS_WITH(Optimizer::create(twice, solo(), options()), Catch::Contains("emb.weight") && Catch::Contains("twice"));
}

TEST_CASE("fused AdamW (multi-tensor per bucket) equals the per-tensor optimizer (bit for bit on CPU)", "[train][optim]") {
  // The multi-tensor clipping norm (CUDA's) equals the per-tensor one within fp32 rounding.
  {
    auto params = fake_model(at::kFloat);
    auto g = fake_grads(params, 3);
    auto solo_group = runtime::Communicator::solo();
    const float a = global_grad_norm(g, *solo_group).item<float>(), b = global_grad_norm(g, *solo_group, at::kCPU, true).item<float>();
    CHECK(b == Approx(a).epsilon(1e-6));
  }
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    INFO(c10::toString(dtype));
    auto pa = fake_model(dtype), pb = fake_model(dtype);
    OptimizerOptions fused = options(1.0);
    fused.fused_adamw = true;
    auto plain = Optimizer::create(pa, solo(), options(1.0));
    auto multi = Optimizer::create(pb, solo(), fused);
    for (int step = 0; step < 8; ++step) {
      auto g = fake_grads(pa, 50 + step, 0.7);
      plain->zero_grad();
      multi->zero_grad();
      set_grads(pa, g);
      set_grads(pb, g);
      plain->accumulate_grads();
      multi->accumulate_grads();
      auto ra = plain->step(1e-2).read(), rb = multi->step(1e-2).read();
      CHECK(rb.grad_norm == ra.grad_norm);
      CHECK(ra.clip_coefficient < 1.0);
    }
    auto sa = plain->state_dict(), sb = multi->state_dict();
    for (const auto& [key, t] : sa.tensors) {
      INFO(key);
      CHECK(at::equal(sb.tensors.at(key), t));
    }
    for (size_t i = 0; i < pa.size(); ++i) {
      INFO(pa[i].name);
      CHECK(at::equal(pb[i].tensor.detach(), pa[i].tensor.detach()));
      CHECK(at::equal(pb[i].tensor.detach(), sb.tensors.at("main/" + pb[i].name).to(dtype)));
    }
  }
}
