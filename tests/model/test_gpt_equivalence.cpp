// A GPT split over t tensor-parallel ranks (with or without sequence parallelism) and with any
// recomputation setting computes the same per-token loss and the same gradients of every
// parameter as the single-process model without recomputation, with and without dropout
// (masks keyed by global position) and with label smoothing. Replicated parameters' gradients are identical on every
// tensor rank. The fused attention core (use_flash_attention, attention dropout 0) equals the
// unfused single-process model under the same layouts and recompute settings. The reference
// runs without the op library's fused norm / activation / RoPE kernels (ATen compositions), the
// layouts with them. Ranks: Gloo over
// loopback, fp32, tiny model.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <chrono>
#include <sstream>

#include "harness/multiprocess.h"
#include "harness/worker_groups.h"
#include "launch/env_rendezvous.h"
#include "model_test_util.h"
#include "runtime/process_groups.h"

using namespace loom;
using namespace loom::model;
using namespace loom::model::test;

namespace {

struct Variant {
  bool sequence_parallel;
  RecomputeGranularity granularity;
  RecomputeMethod method;
  double dropout;
  bool flash = false;  ///< fused attention core; the reference stays unfused
  std::string name() const {
    std::ostringstream s;
    s << "sp=" << sequence_parallel << (flash ? " flash" : "") << " recompute=" << recipe_name(granularity);
    if (granularity == RecomputeGranularity::kFull) s << "/" << recipe_name(method);
    s << " dropout=" << dropout << " label_smoothing=" << (dropout > 0 ? 0.1 : 0.0);
    return s.str();
  }
};

std::vector<Variant> all_variants(bool with_sp) {
  std::vector<Variant> out;
  for (bool sp : {false, true}) {
    if (sp && !with_sp) continue;
    for (double p : {0.0, 0.1}) {
      out.push_back({sp, RecomputeGranularity::kNone, RecomputeMethod::kUniform, p});
      out.push_back({sp, RecomputeGranularity::kSelective, RecomputeMethod::kUniform, p});
      out.push_back({sp, RecomputeGranularity::kFull, RecomputeMethod::kUniform, p});
      out.push_back({sp, RecomputeGranularity::kFull, RecomputeMethod::kBlock, p});
    }
    // Fused attention: no attention dropout and no selective recompute (the layout rules refuse both).
    out.push_back({sp, RecomputeGranularity::kNone, RecomputeMethod::kUniform, 0.0, true});
    out.push_back({sp, RecomputeGranularity::kFull, RecomputeMethod::kUniform, 0.0, true});
    out.push_back({sp, RecomputeGranularity::kFull, RecomputeMethod::kBlock, 0.0, true});
  }
  return out;
}

// Runs every variant on `tp` and compares it to the single-process reference computed locally.
// Returns a description of every mismatch (empty: all equal).
std::vector<std::string> check_variants(const runtime::CommunicatorPtr& tp, const GptConfig& base = tiny_config()) {
  std::vector<std::string> failures;
  auto solo = runtime::Communicator::solo();
  DropoutContext dropout;
  dropout.seed = 1234;
  dropout.step = 3;
  for (const Variant& v : all_variants(tp->size() > 1)) {
    GptConfig ref_cfg = base;
    ref_cfg.hidden_dropout = ref_cfg.attention_dropout = v.dropout;
    ref_cfg.label_smoothing = v.dropout > 0 ? 0.1 : 0.0;  // the dropout variants also smooth
    GptConfig cfg = ref_cfg;
    // The reference runs ATen's compositions, the layouts the op library's fused norm,
    // activation and RoPE kernels (the defaults): each layout also checks the fused ops.
    ref_cfg.persist_layer_norm = ref_cfg.bias_activation_fusion = ref_cfg.apply_rope_fusion = false;
    cfg.use_flash_attention = v.flash;
    cfg.layout.sequence_parallel = v.sequence_parallel;
    cfg.layout.recompute.granularity = v.granularity;
    cfg.layout.recompute.method = v.method;
    cfg.layout.recompute.num_layers = 2;  // 3 layers: uniform chunks {2, 1}; block: 2 of 3
    Batch batch = make_batch(cfg, 2);

    GptStage reference(ref_cfg, solo);
    Result want = run_step(reference, batch, dropout, *solo);
    GptStage model(cfg, tp);
    Result got = run_step(model, batch, dropout, *tp);

    auto fail = [&](const std::string& what) { failures.push_back(v.name() + ": " + what); };
    const double loss_err = rel_err(got.loss, want.loss);
    if (!(loss_err <= 1e-5)) fail("loss rel. error " + std::to_string(loss_err));
    if (got.grads.size() != want.grads.size()) fail("different parameter sets");
    for (const auto& [name, g] : want.grads) {
      auto it = got.grads.find(name);
      if (it == got.grads.end()) {
        fail("missing parameter " + name);
        continue;
      }
      if (it->second.sizes() != g.sizes()) {
        fail(name + " shape " + c10::str(it->second.sizes()) + " vs " + c10::str(g.sizes()));
        continue;
      }
      const double err = rel_err(it->second, g);
      if (!(err <= 1e-5)) fail(name + " grad rel. error " + std::to_string(err));
    }
    // Replicated parameters: bitwise-identical gradients on every tensor rank.
    for (const auto& p : model.parameters()) {
      if (p.tensor_parallel() || tp->size() == 1) continue;
      at::Tensor all = comm::all_gather_dim0(p.tensor.grad().unsqueeze(0).contiguous(), *tp);
      if (!all.eq(all[0].unsqueeze(0)).all().item<bool>()) fail(p.name + " grad differs across TP ranks");
    }
  }
  return failures;
}

std::shared_ptr<runtime::ProcessGroups> make_groups() {
  return loom::test::worker_groups(loom::test::env_int("T"));
}

}  // namespace

LOOM_WORKER("gpt_equivalence") {
  auto groups = make_groups();
  const std::string arch = loom::test::env_str("LLAMA", "0");
  auto failures = check_variants(groups->tensor_ptr(), arch == "1"       ? tiny_llama_config()
                                                       : arch == "extras" ? tiny_llama_extras_config()
                                                                         : tiny_config());
  std::string all;
  for (const auto& f : failures) all += "\n  " + f;
  LOOM_WCHECK(failures.empty(), + all);
  groups->shutdown();
}

TEST_CASE("t=1: every recompute setting equals the plain single-process model", "[model]") {
  auto failures = check_variants(runtime::Communicator::solo());
  for (const auto& f : failures) UNSCOPED_INFO(f);
  CHECK(failures.empty());
}

TEST_CASE("t=2: TP, TP+SP and every recompute setting equal the single-process model",
          "[model][multiprocess]") {
  auto r = loom::test::run_ranks("gpt_equivalence", 2, {{"T", "2"}}, 300.0);
  INFO(r.summary());
  CHECK(r.exit_code() == 0);
}

TEST_CASE("Llama config, t=1: every recompute setting equals the plain single-process model", "[model][llama]") {
  auto failures = check_variants(runtime::Communicator::solo(), tiny_llama_config());
  for (const auto& f : failures) UNSCOPED_INFO(f);
  CHECK(failures.empty());
}

TEST_CASE("Llama config, t=2: TP, TP+SP and every recompute setting equal the single-process model",
          "[model][multiprocess][llama]") {
  // 2 K/V heads over 2 ranks: one group per rank; SwiGLU's gate and up split with their rows.
  auto r = loom::test::run_ranks("gpt_equivalence", 2, {{"T", "2"}, {"LLAMA", "1"}}, 300.0);
  INFO(r.summary());
  CHECK(r.exit_code() == 0);
}

TEST_CASE("Llama extras (QKV bias only, tied output, kv_channels, partial rotary, rope scaling), t=2: TP, TP+SP and "
          "every recompute setting equal the single-process model", "[model][multiprocess][llama]") {
  // The QKV bias splits with its per-group rows; the projection's a·d input columns split by head.
  auto r = loom::test::run_ranks("gpt_equivalence", 2, {{"T", "2"}, {"LLAMA", "extras"}}, 300.0);
  INFO(r.summary());
  CHECK(r.exit_code() == 0);
}

TEST_CASE("t=4: TP, TP+SP and every recompute setting equal the single-process model",
          "[model][multiprocess]") {
  auto r = loom::test::run_ranks("gpt_equivalence", 4, {{"T", "4"}}, 300.0);
  INFO(r.summary());
  CHECK(r.exit_code() == 0);
}
