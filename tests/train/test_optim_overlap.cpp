// Overlapped gradient reduction (model.optim.overlap_grad_sync, train/optim/grad_overlap.h)
// equals the reduction after backward bit for bit: a tiny GPT trained through the real step
// (GptStep: pipeline schedule, autograd, the optimizer's hooks) with overlap off and on gives
// identical losses, gradient norms, finalised gradients and parameters, for d = 2 (tied
// embeddings inside one stage), the distributed optimizer, d = 2 x p = 2 (1F1B and interleaved;
// the tied embedding across the end stages), t = 2 with sequence parallelism, bf16, and fp16
// with dynamic loss scaling; and a run resumed from the optimizer state after step 2 repeats
// step 3 of the uninterrupted run bit for bit. Each case also checks that buckets really started
// inside backward. With the distributed optimizer the "on" runs also overlap the parameter
// all-gather (model.optim.overlap_param_sync): the next step's forward waits per bucket, each
// layer for its own parameters (train/param_gather_wait.h). A second test follows those waits
// call by call: the gathers are completed in the forward's order, only as far as each layer
// needs, the later layers' buckets still in flight (d = 2, d = 2 x p = 2 1F1B and interleaved, with
// full recomputation rerunning the hooks in backward), and the run equals the one without
// overlap bit for bit.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <map>
#include <optional>

#include "harness/multiprocess.h"
#include "harness/worker_groups.h"
#include "model/gpt_stage.h"
#include "train/gpt_step.h"
#include "train/model_setup.h"
#include "train/param_gather_wait.h"
#include "train/optim/loss_scaler.h"
#include "train/optim/optimizer.h"

using namespace loom;
using namespace loom::train;

namespace {

constexpr int kSteps = 3;

struct Case {
  int t, p, v, d, m;
  bool distributed;
  Precision dtype;
};

Case case_from_env() {
  Case c;
  c.t = test::env_int("T");
  c.p = test::env_int("P");
  c.v = test::env_int("V");
  c.m = test::env_int("M");
  c.distributed = test::env_int("DIST") != 0;
  c.dtype = static_cast<Precision>(test::env_int("DTYPE"));
  return c;
}

model::GptConfig config_for(const Case& c) {
  model::GptConfig g;
  g.num_layers = 4;
  g.hidden_size = 32;
  g.num_attention_heads = 4;
  g.vocab_size = 100;
  g.max_position_embeddings = 8;
  g.seq_length = 8;
  g.hidden_dropout = 0.1;  // dropout on: keyed by (seed, step, row), the same in both runs
  g.attention_dropout = 0.1;
  g.layout.sequence_parallel = c.t > 1;
  g.params_dtype = c.dtype;
  g.seed = 7;
  return g;
}

// Micro-batch k of data rank `dp` at `step`: random tokens, some loss-mask zeros.
MicroBatch micro_batch(const model::GptConfig& g, int step, int dp, int k, int d, int64_t b) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9000 + 100 * step + 10 * dp + k);
  MicroBatch mb;
  mb.tokens = at::randint(g.vocab_size, {b, g.seq_length}, gen, at::kLong);
  mb.labels = at::randint(g.vocab_size, {b, g.seq_length}, gen, at::kLong);
  mb.loss_mask = (at::rand({b, g.seq_length}, gen) > 0.2).to(at::kFloat);
  mb.position_ids = at::arange(g.seq_length, at::kLong).unsqueeze(0).expand({b, g.seq_length}).contiguous();
  mb.global_row = (int64_t(k) * d + dp) * b;
  return mb;
}

struct StepRecord {
  at::Tensor loss, grads;  // the step's loss and the finalised (clipped) fp32 gradient buffer
  float grad_norm;
  bool skipped;
};

struct Trained {
  std::vector<StepRecord> steps;
  std::vector<at::Tensor> params;
  int started_in_backward = 0;
};

Layout shape_for(const Case& c, const model::GptConfig& cfg) {
  Layout shape;  // m = global_batch / (micro_batch·d) = c.m; s is the model's
  shape.tp = c.t, shape.pp = c.p, shape.vp = c.v, shape.dp = c.d;
  shape.micro_batch = 2;
  shape.global_batch = 2 * c.m * c.d;
  return shape;
}

// `overlap`: the gradient reduction, and with the distributed optimizer the parameter gather too
// (the next step's forward waits for it per bucket).
optim::OptimizerOptions options_for(const Case& c, bool overlap) {
  optim::OptimizerOptions o;
  o.adamw = optim::AdamWConfig{0.9, 0.95, 1e-8, 0.1};
  o.distributed = c.distributed;
  o.bucket_bytes = 4 * 3000;  // several buckets per stage, each layer spanning several
  o.clip_grad = 0.5;
  o.overlap_grad_reduce = overlap;
  o.overlap_param_gather = overlap && c.distributed;
  return o;
}

// This data rank's micro-batches of step `s` and the step's dropout keys.
std::vector<MicroBatch> step_batches(const Case& c, const model::GptConfig& cfg, const Layout& shape, int dp, int s) {
  std::vector<MicroBatch> batches;
  for (int k = 0; k < c.m; ++k) batches.push_back(micro_batch(cfg, s, dp, k, c.d, shape.micro_batch));
  return batches;
}

model::DropoutContext step_dropout(const Layout& shape, int s) {
  model::DropoutContext dropout;
  dropout.seed = 11;
  dropout.step = s;
  dropout.global_batch = shape.global_batch;
  return dropout;
}

// Trains steps [from, kSteps) of a fresh model, first restoring `state` / `scaler_state` when given.
Trained train_steps(const Case& c, runtime::ProcessGroups& groups, const std::shared_ptr<runtime::ProcessGroups>& g,
              bool overlap, int from, int until, const optim::OptimizerState* state,
              const nlohmann::json* scaler_state, optim::OptimizerState* state_out = nullptr,
              nlohmann::json* scaler_out = nullptr) {
  const model::GptConfig cfg = config_for(c);
  const Layout shape = shape_for(c, cfg);
  auto chunks = build_model_chunks(cfg, groups, c.v, groups.device());
  const optim::OptimizerOptions o = options_for(c, overlap);
  auto opt = optim::Optimizer::create(chunk_parameters(chunks), g, o);
  if (o.overlap_param_gather) wait_for_params_in_forward(chunks, *opt);
  std::optional<optim::LossScaler> scaler;
  if (c.dtype == Precision::kFp16) {
    optim::LossScalerConfig sc;
    sc.initial_scale = 65536.0;
    sc.growth_interval = 2;  // a growth inside the run
    scaler.emplace(sc);
  }
  if (state) opt->load_state_dict(*state);
  if (scaler_state) scaler->load_state_dict(*scaler_state);
  GptStep step(chunks, groups, shape);
  Trained out;
  for (int s = from; s < until; ++s) {
    const std::vector<MicroBatch> batches = step_batches(c, cfg, shape, groups.coords().dp, s);
    const model::DropoutContext dropout = step_dropout(shape, s);
    opt->start_iteration(c.m);
    at::Tensor loss = step.train(batches, dropout, scaler ? scaler->scale_tensor() : at::Tensor(), [&] { opt->accumulate_grads(); });
    auto r = opt->step(1e-3, scaler ? &*scaler : nullptr).read();
    out.steps.push_back({loss.clone(), opt->grads().data().clone(), r.grad_norm, r.skipped});
    out.started_in_backward += opt->buckets_started_in_backward();
  }
  opt->wait_for_params();  // overlap_param_gather leaves the last step's gather in flight
  for (const auto& p : opt->params()) out.params.push_back(p.tensor.detach().clone());
  if (state_out) *state_out = opt->state_dict();
  if (scaler_out && scaler) *scaler_out = scaler->state_dict();
  return out;
}

void check_equal(const Trained& a, const Trained& b, const std::string& what, size_t first_step = 0) {
  for (size_t s = 0; s < b.steps.size(); ++s) {
    const auto& x = a.steps[first_step + s];
    const auto& y = b.steps[s];
    const std::string at_step = what + " step " + std::to_string(first_step + s + 1);
    LOOM_WCHECK(at::equal(x.loss, y.loss), "(" + at_step + ": loss)");
    LOOM_WCHECK(at::equal(x.grads, y.grads), "(" + at_step + ": finalised gradients)");
    LOOM_WCHECK((x.grad_norm == y.grad_norm || (std::isnan(x.grad_norm) && std::isnan(y.grad_norm))),
                "(" + at_step + ": grad norm " + std::to_string(x.grad_norm) + " vs " + std::to_string(y.grad_norm) + ")");
    LOOM_WCHECK(x.skipped == y.skipped, "(" + at_step + ": skipped)");
  }
  LOOM_WCHECK(a.params.size() == b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i)
    LOOM_WCHECK(at::equal(a.params[i], b.params[i]), "(" + what + ": parameter " + std::to_string(i) + ")");
}

}  // namespace

LOOM_WORKER("optim_overlap_equal") {
  Case c = case_from_env();
  auto g = test::worker_groups(c.t, c.p);
  c.d = g->layout().data_parallel();
  const Trained off = train_steps(c, *g, g, false, 0, kSteps, nullptr, nullptr);
  const Trained on = train_steps(c, *g, g, true, 0, kSteps, nullptr, nullptr);
  LOOM_WCHECK(off.started_in_backward == 0);
  LOOM_WCHECK(on.started_in_backward > 0, "(no bucket started inside backward)");
  check_equal(off, on, "overlap on vs off");
  for (const auto& s : off.steps) LOOM_WCHECK(!s.skipped || c.dtype == Precision::kFp16, "(a step was skipped)");

  // Resume: steps 1-2 with overlap, save, a fresh model restores and trains step 3.
  optim::OptimizerState state;
  nlohmann::json scaler_state;
  train_steps(c, *g, g, true, 0, 2, nullptr, nullptr, &state, &scaler_state);
  const Trained resumed = train_steps(c, *g, g, true, 2, kSteps, &state,
                                c.dtype == Precision::kFp16 ? &scaler_state : nullptr);
  check_equal(off, resumed, "resumed", 2);
  g->world().barrier();
  g->shutdown();
}

TEST_CASE("overlapped gradient reduction equals the reduction after backward, bit for bit", "[train][optim][multiprocess]") {
  struct Run {
    const char* name;
    int world, t, p, v, m, dist;
    Precision dtype;
  };
  const Run runs[] = {
      {"d=2 plain fp32 (tied embeddings in one stage)", 2, 1, 1, 1, 2, 0, Precision::kFp32},
      {"d=2 distributed bf16", 2, 1, 1, 1, 2, 1, Precision::kBf16},
      {"d=2 x p=2 plain fp16 with loss scaling (embedding across stages)", 4, 1, 2, 1, 4, 0, Precision::kFp16},
      {"d=2 x p=2 v=2 distributed fp32 (interleaved)", 4, 1, 2, 2, 2, 1, Precision::kFp32},
      {"t=2 (sequence parallel) x d=2 distributed fp32", 4, 2, 1, 1, 2, 1, Precision::kFp32},
  };
  for (const auto& r : runs) {
    INFO(r.name);
    auto res = test::run_ranks("optim_overlap_equal", r.world,
                               {{"T", std::to_string(r.t)}, {"P", std::to_string(r.p)}, {"V", std::to_string(r.v)},
                                {"M", std::to_string(r.m)}, {"DIST", std::to_string(r.dist)},
                                {"DTYPE", std::to_string(static_cast<int>(r.dtype))}});
    REQUIRE(res.exit_code() == 0);
  }
}

namespace {

// One read-hook call of the training forward: the part's range in optimizer.params() and the
// gathers still in flight before and after its wait.
struct HookCall {
  size_t first, end;
  int pending_before, pending_after;
};

struct WaitedRun {
  std::vector<at::Tensor> losses, params;
  std::vector<std::vector<HookCall>> calls;  // per step
  int buckets = 0;
  std::vector<size_t> bucket_of;  // parameter -> bucket
};

// Full recomputation (one layer per group) so that backward reruns the layers' hooks too.
WaitedRun train_recorded(const Case& c, runtime::ProcessGroups& groups, const std::shared_ptr<runtime::ProcessGroups>& g,
                         bool overlap) {
  model::GptConfig cfg = config_for(c);
  cfg.layout.recompute.granularity = model::RecomputeGranularity::kFull;
  cfg.layout.recompute.num_layers = 1;
  const Layout shape = shape_for(c, cfg);
  auto chunks = build_model_chunks(cfg, groups, c.v, groups.device());
  auto opt = optim::Optimizer::create(chunk_parameters(chunks), g, options_for(c, overlap));
  WaitedRun out;
  out.buckets = static_cast<int>(opt->grads().buckets().size());
  out.bucket_of.assign(opt->params().size(), 0);
  for (size_t b = 0; b < opt->grads().buckets().size(); ++b)
    for (size_t i : opt->grads().buckets()[b].params) out.bucket_of[i] = b;
  if (overlap) {
    wait_for_params_in_forward(chunks, *opt);
    size_t offset = 0;
    for (auto& chunk : chunks) {  // record around the production hook
      auto inner = chunk.param_read_hook();
      chunk.set_param_read_hook([&, inner, offset](size_t first, size_t end) {
        const int before = opt->param_gathers_pending();
        inner(first, end);
        out.calls.back().push_back({offset + first, offset + end, before, opt->param_gathers_pending()});
      });
      offset += chunk.parameters().size();
    }
  }
  GptStep step(chunks, groups, shape);
  for (int s = 0; s < kSteps; ++s) {
    const std::vector<MicroBatch> batches = step_batches(c, cfg, shape, groups.coords().dp, s);
    const model::DropoutContext dropout = step_dropout(shape, s);
    out.calls.emplace_back();
    opt->start_iteration(c.m);
    out.losses.push_back(step.train(batches, dropout, at::Tensor(), [&] { opt->accumulate_grads(); }).clone());
    LOOM_WCHECK(opt->param_gathers_pending() == 0, "(gathers left after the step's forward and backward)");
    opt->step(1e-3);
  }
  opt->wait_for_params();
  for (const auto& p : opt->params()) out.params.push_back(p.tensor.detach().clone());
  return out;
}

}  // namespace

LOOM_WORKER("optim_param_wait_per_bucket") {
  Case c = case_from_env();
  auto g = test::worker_groups(c.t, c.p);
  c.d = g->layout().data_parallel();
  const WaitedRun off = train_recorded(c, *g, g, false);
  const WaitedRun on = train_recorded(c, *g, g, true);
  for (int s = 0; s < kSteps; ++s)
    LOOM_WCHECK(at::equal(off.losses[s], on.losses[s]), "(loss of step " + std::to_string(s + 1) + ")");
  for (size_t i = 0; i < off.params.size(); ++i)
    LOOM_WCHECK(at::equal(off.params[i], on.params[i]), "(parameter " + std::to_string(i) + ")");

  LOOM_WCHECK(on.buckets >= 4, "(" + std::to_string(on.buckets) + " buckets: too few to see per-bucket waits)");
  // Step 1 follows no overlapped step: nothing is pending.
  for (const auto& call : on.calls[0]) LOOM_WCHECK(call.pending_before == 0 && call.pending_after == 0);
  for (int s = 1; s < kSteps; ++s) {
    const auto& calls = on.calls[s];
    const std::string at_step = "step " + std::to_string(s + 1);
    LOOM_WCHECK(!calls.empty(), "(" + at_step + ": no hook call)");
    // start_iteration() left every bucket in flight for the forward.
    LOOM_WCHECK(calls.front().pending_before == on.buckets, "(" + at_step + ": " + std::to_string(calls.front().pending_before) +
                                                                " pending at the first hook, expected all " +
                                                                std::to_string(on.buckets) + ")");
    std::vector<char> read(on.bucket_of.size(), 0);
    bool later_layers_pending = false;
    for (const auto& call : calls) {
      // Issued in forward order (bucket n-1 first), completed only down to the lowest bucket
      // this part needs: exactly the buckets below it stay in flight.
      int expected = call.pending_before;
      for (size_t i = call.first; i < call.end; ++i) {
        expected = std::min(expected, static_cast<int>(on.bucket_of[i]));
        read[i] = 1;
      }
      LOOM_WCHECK(call.pending_after == expected, "(" + at_step + ": part [" + std::to_string(call.first) + ", " +
                                                      std::to_string(call.end) + ") left " +
                                                      std::to_string(call.pending_after) + " pending, expected " +
                                                      std::to_string(expected) + ")");
      if (call.end > call.first && call.pending_after > 0) later_layers_pending = true;
    }
    LOOM_WCHECK(later_layers_pending, "(" + at_step + ": no part ran while later buckets were in flight)");
    for (size_t i = 0; i < read.size(); ++i)
      LOOM_WCHECK(read[i], "(" + at_step + ": parameter " + std::to_string(i) + " read without its hook)");
  }
  g->world().barrier();
  g->shutdown();
}

TEST_CASE("the overlapped parameter all-gather is waited per bucket by the next forward", "[train][optim][multiprocess]") {
  struct Run {
    const char* name;
    int world, p, v, m;
  };
  const Run runs[] = {
      {"d=2 distributed fp32", 2, 1, 1, 2},
      {"d=2 x p=2 distributed fp32 (1F1B)", 4, 2, 1, 4},
      {"d=2 x p=2 v=2 distributed fp32 (interleaved)", 4, 2, 2, 2},
  };
  for (const auto& r : runs) {
    INFO(r.name);
    auto res = test::run_ranks("optim_param_wait_per_bucket", r.world,
                               {{"T", "1"}, {"P", std::to_string(r.p)}, {"V", std::to_string(r.v)},
                                {"M", std::to_string(r.m)}, {"DIST", "1"},
                                {"DTYPE", std::to_string(static_cast<int>(Precision::kFp32))}});
    REQUIRE(res.exit_code() == 0);
  }
}
