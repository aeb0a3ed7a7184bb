// LoRA adapters on the attention and MLP linears (model/lora.h, docs/design/lora.md): with B = 0
// the model is exactly the base model; the adapted model equals the base with merged weights
// W + (alpha/r)·B A; and under t = 2 (with and without sequence parallelism, recompute, two
// pipeline stages) the loss and every adapter gradient equal the single-process model's, with
// adapter dropout on. The base is frozen: only adapters take gradients. Ranks: Gloo over
// loopback, fp32, tiny model.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <sstream>

#include "harness/multiprocess.h"
#include "harness/worker_groups.h"
#include "model/init.h"
#include "model/kv_cache.h"
#include "model/lora.h"
#include "model/lora_serving.h"
#include "model_test_util.h"

using namespace loom;
using namespace loom::model;
using namespace loom::model::test;

namespace {

bool is_adapter(const std::string& name) { return name.find(".lora_") != std::string::npos; }

GptConfig with_lora(GptConfig c, double dropout = 0.0) {
  c.lora.dim = 4;
  c.lora.alpha = 8.0;
  c.lora.targets = kLoraAllTargets;
  c.lora.dropout = dropout;
  return c;
}

// Freezes every base parameter and gives every B a deterministic non-zero value drawn from its
// full tensor (with B = 0, A's gradient would be zero and the checks weak). Returns the adapters.
ParamList adapters_of(const GptStage& stage, int tp_rank, int tp_size) {
  ParamList out;
  at::NoGradGuard no_grad;
  for (const auto& p : stage.parameters()) {
    if (!is_adapter(p.name)) {
      p.tensor.requires_grad_(false);
      continue;
    }
    if (p.name.find(".lora_b.") != std::string::npos) {
      std::vector<int64_t> shape(p.tensor.sizes().begin(), p.tensor.sizes().end());
      if (p.partition_dim >= 0) shape[p.partition_dim] *= tp_size;
      at::Tensor full = full_normal(77, p.name, shape, 0.1);
      p.tensor.copy_(p.partition_dim >= 0 ? shard(full, p.partition_dim, tp_rank, tp_size) : full);
    }
    out.push_back(p);
  }
  return out;
}

// The per-token loss and the full gradient of every adapter after one backward of the mean
// loss, the model whole or cut into stages [0, 2) + [2, 3).
Result run_adapted(const GptConfig& cfg, const runtime::CommunicatorPtr& tp, const Batch& batch,
                   const DropoutContext& dropout, bool two_stages) {
  std::vector<GptStage> stages;
  if (two_stages) {
    stages.emplace_back(cfg, tp, StageChunk{0, 2, true, false});
    stages.emplace_back(cfg, tp, StageChunk{2, 3, false, true});
  } else {
    stages.emplace_back(cfg, tp);
  }
  ParamList adapters;
  for (const auto& s : stages)
    for (const auto& p : adapters_of(s, tp->rank(), tp->size())) adapters.push_back(p);
  StageInputs in;
  in.tokens = batch.tokens;
  in.position_ids = batch.positions;
  Result r;
  if (two_stages) {
    at::Tensor sent = stages[0].forward(in, dropout);
    StageInputs in2;
    in2.hidden = sent.detach().requires_grad_(true);
    in2.labels = batch.labels;
    at::Tensor loss = stages[1].forward(in2, dropout);
    loss.mean().backward();
    sent.backward(in2.hidden.grad());
    r.loss = loss.detach();
  } else {
    in.labels = batch.labels;
    at::Tensor loss = stages[0].forward(in, dropout);
    loss.mean().backward();
    r.loss = loss.detach();
  }
  all_reduce_sequence_parallel_grads(adapters, *tp);
  for (const auto& p : adapters) r.grads[p.name] = full_grad(p, *tp);
  for (const auto& s : stages)
    for (const auto& p : s.parameters())
      if (!is_adapter(p.name) && p.tensor.grad().defined()) r.grads["base took a gradient: " + p.name] = at::Tensor();
  return r;
}

// Every layout variant on `tp` against the whole single-process model (no recompute).
std::vector<std::string> check_layouts(const runtime::CommunicatorPtr& tp, const GptConfig& arch) {
  std::vector<std::string> failures;
  const GptConfig ref_cfg = with_lora(arch, /*dropout=*/0.1);
  DropoutContext dropout;
  dropout.step = 5;
  const Batch batch = make_batch(ref_cfg, 2);
  const Result want = run_adapted(ref_cfg, runtime::Communicator::solo(), batch, dropout, false);
  if (want.grads.size() != 4 * 2 * 3)
    failures.push_back("expected 24 adapter tensors, found " + std::to_string(want.grads.size()));
  struct Variant {
    bool sp;
    RecomputeGranularity granularity;
    bool two_stages;
  };
  // Each setting at least once, SP with each recompute, cut into stages or not (CI time is short).
  const std::vector<Variant> variants = {{false, RecomputeGranularity::kNone, false},
                                         {false, RecomputeGranularity::kFull, true},
                                         {true, RecomputeGranularity::kSelective, false},
                                         {true, RecomputeGranularity::kNone, true},
                                         {true, RecomputeGranularity::kFull, true}};
  for (const auto& [sp, granularity, two_stages] : variants) {
    if (sp && tp->size() == 1) continue;
    GptConfig cfg = ref_cfg;
    cfg.layout.sequence_parallel = sp;
    cfg.layout.recompute.granularity = granularity;
    cfg.layout.recompute.method = RecomputeMethod::kUniform;
    cfg.layout.recompute.num_layers = 1;
    std::ostringstream name;
    name << "t=" << tp->size() << " sp=" << sp << " recompute=" << recipe_name(granularity)
         << " stages=" << (two_stages ? 2 : 1) << ": ";
    const Result got = run_adapted(cfg, tp, batch, dropout, two_stages);
    const double loss_err = rel_err(got.loss, want.loss);
    if (!(loss_err <= 1e-5)) failures.push_back(name.str() + "loss rel. error " + std::to_string(loss_err));
    if (got.grads.size() != want.grads.size()) failures.push_back(name.str() + "different parameter sets");
    for (const auto& [param, g] : want.grads) {
      auto it = got.grads.find(param);
      if (it == got.grads.end() || !it->second.defined()) {
        failures.push_back(name.str() + "missing " + param);
        continue;
      }
      const double err = rel_err(it->second, g);
      if (!(err <= 1e-5)) failures.push_back(name.str() + param + " grad rel. error " + std::to_string(err));
      if (!(g.abs().max().item<double>() > 0)) failures.push_back(name.str() + param + " has a zero gradient");
    }
  }
  return failures;
}

at::Tensor logits_of(const GptStage& stage, const Batch& batch) {
  StageInputs in;
  in.tokens = batch.tokens;
  in.position_ids = batch.positions;
  DropoutContext off;
  off.training = false;
  at::NoGradGuard no_grad;
  return stage.forward(in, off);
}

// The base with `adapters` (full tensors by name, scaled by `scale`) folded into its weights.
GptStage merged_model(const GptConfig& arch, const std::map<std::string, at::Tensor>& adapters, double scale) {
  GptStage merged(arch, runtime::Communicator::solo());
  at::NoGradGuard no_grad;
  for (const auto& p : merged.parameters()) {
    const std::string linear = p.name.substr(0, p.name.size() - std::string(".weight").size());
    auto a = adapters.find(lora_a_name(linear));
    if (a != adapters.end()) p.tensor.copy_(merge_lora_weight(p.tensor, a->second, adapters.at(lora_b_name(linear)), scale));
  }
  return merged;
}

// The cached forward's logits [n, rows, V] of `tokens` [rows, n] from an empty cache.
at::Tensor cached_logits(const GptStage& stage, const at::Tensor& tokens, const LoraBatch& served = {}) {
  KvCache cache = stage.make_kv_cache(tokens.size(0), tokens.size(1));
  return stage.forward_cached(tokens, cache, {}, {}, served);
}

}  // namespace

TEST_CASE("LoRA: with B = 0 the adapted model is exactly the base model", "[model][lora]") {
  for (const GptConfig& arch : {tiny_config(), tiny_llama_config()}) {
    auto solo = runtime::Communicator::solo();
    const Batch batch = make_batch(arch, 2);
    GptStage base(arch, solo);
    GptStage adapted(with_lora(arch), solo);
    CHECK(at::equal(logits_of(adapted, batch), logits_of(base, batch)));
    int adapters = 0;
    for (const auto& p : adapted.parameters()) {
      if (!is_adapter(p.name)) continue;
      ++adapters;
      if (p.name.find(".lora_b.") != std::string::npos) CHECK(p.tensor.abs().max().item<double>() == 0.0);
      // A: PEFT's Kaiming-uniform bound 1/sqrt(in), not zero.
      if (p.name.find(".lora_a.") != std::string::npos) {
        const double bound = 1.0 / std::sqrt(double(p.tensor.size(1)));
        CHECK(p.tensor.abs().max().item<double>() <= bound);
        CHECK(p.tensor.abs().max().item<double>() > 0.5 * bound);
      }
    }
    CHECK(adapters == 4 * 2 * arch.num_layers);
  }
}

TEST_CASE("LoRA: the adapted model equals the base model with merged weights W + (alpha/r)·B A", "[model][lora]") {
  for (const GptConfig& arch : {tiny_config(), tiny_llama_config()}) {
    auto solo = runtime::Communicator::solo();
    const Batch batch = make_batch(arch, 2);
    const GptConfig cfg = with_lora(arch);
    GptStage adapted(cfg, solo);
    const ParamList adapters = adapters_of(adapted, 0, 1);
    std::map<std::string, at::Tensor> by_name;
    for (const auto& p : adapters) by_name[p.name] = p.tensor.detach();
    GptStage merged(arch, solo);
    int merged_weights = 0;
    {
      at::NoGradGuard no_grad;
      for (const auto& p : merged.parameters()) {
        const std::string linear = p.name.substr(0, p.name.size() - std::string(".weight").size());
        auto a = by_name.find(lora_a_name(linear));
        if (a == by_name.end()) continue;
        p.tensor.copy_(merge_lora_weight(p.tensor, a->second, by_name.at(lora_b_name(linear)), cfg.lora.scale()));
        ++merged_weights;
      }
    }
    CHECK(merged_weights == 4 * arch.num_layers);
    const at::Tensor want = logits_of(merged, batch);
    const at::Tensor got = logits_of(adapted, batch);
    CHECK(rel_err(got, want) < 1e-5);
    CHECK(rel_err(logits_of(GptStage(arch, solo), batch), want) > 1e-3);  // the adapters change the model
  }
}

TEST_CASE("LoRA: two pipeline stages and recompute equal the whole model (t=1)", "[model][lora]") {
  auto failures = check_layouts(runtime::Communicator::solo(), tiny_config());
  for (const auto& f : failures) UNSCOPED_INFO(f);
  CHECK(failures.empty());
}

LOOM_WORKER("lora_layouts") {
  auto groups = loom::test::worker_groups(2);
  for (const GptConfig& arch : {tiny_config(), tiny_llama_config()}) {
    auto failures = check_layouts(groups->tensor_ptr(), arch);
    std::string all;
    for (const auto& f : failures) all += "\n  " + f;
    LOOM_WCHECK(failures.empty(), + all);
  }
  groups->shutdown();
}

TEST_CASE("LoRA under t=2 with and without SP, recompute and two pipeline stages equals one process",
          "[model][lora][multiprocess]") {
  auto r = loom::test::run_ranks("lora_layouts", 2, {}, 180.0);
  INFO(r.summary());
  CHECK(r.exit_code() == 0);
}

TEST_CASE("LoRA: bad settings are refused naming the field", "[model][lora]") {
  GptConfig c = with_lora(tiny_config());
  c.lora.alpha = 0;
  CHECK_THROWS_WITH(c.validate(1), Catch::Contains("model.peft.lora_tuning.alpha"));
  c = with_lora(tiny_config(), 1.0);
  CHECK_THROWS_WITH(c.validate(1), Catch::Contains("model.peft.lora_tuning.adapter_dropout"));
  c = tiny_config();
  c.lora.dim = -1;
  CHECK_THROWS_WITH(c.validate(1), Catch::Contains("model.peft.lora_tuning.adapter_dim"));
  CHECK_THROWS_WITH(parse_lora_targets({"attention_qkv", "mlp_fc3"}), Catch::Contains("'mlp_fc3'"));
  CHECK(parse_lora_targets({"all"}) == kLoraAllTargets);
  CHECK(parse_lora_targets({"attention_qkv", "mlp_fc2"}) == (kLoraAttentionQkv | kLoraMlpFc2));
}

TEST_CASE("LoRA serving: base rows and two adapters' rows in one forward equal the base and each merged model",
          "[model][lora]") {
  for (const GptConfig& arch : {tiny_config(), tiny_llama_config()}) {
    auto solo = runtime::Communicator::solo();
    // Adapter 0: every linear at rank 4; adapter 1: QKV and fc2 at rank 2, another alpha.
    GptConfig second = with_lora(arch);
    second.lora.dim = 2;
    second.lora.alpha = 6.0;
    second.lora.targets = kLoraAttentionQkv | kLoraMlpFc2;
    std::vector<GptConfig> configs{with_lora(arch), second};
    std::vector<std::map<std::string, at::Tensor>> full(2);
    LoraBank bank(0, arch.num_layers, solo, at::TensorOptions().dtype(at::kFloat));
    for (size_t i = 0; i < 2; ++i) {
      GptStage adapted(configs[i], solo);
      for (const auto& p : adapters_of(adapted, 0, 1)) full[i][p.name] = p.tensor.detach().clone();
      bank.add(full[i], configs[i].lora, "adapter " + std::to_string(i));
    }
    CHECK(bank.size() == 2);
    CHECK(bank.adapters("layers.0.self_attention.linear_proj")->at(1) == nullptr);  // adapter 1 leaves it alone
    // Rows 0 and 3: the base; rows 1 and 4: adapter 0; row 2: adapter 1. Flat token k·rows + r.
    const at::Tensor tokens = make_batch(arch, 5).tokens;
    const int64_t rows = tokens.size(0), n = tokens.size(1);
    LoraBatch served;
    served.bank = &bank;
    const std::vector<std::vector<int64_t>> of_adapter{{1, 4}, {2}};
    for (int i = 0; i < 2; ++i) {
      std::vector<int64_t> flat;
      for (int64_t k = 0; k < n; ++k)
        for (int64_t r : of_adapter[static_cast<size_t>(i)]) flat.push_back(k * rows + r);
      served.adapter.push_back(i);
      served.tokens.push_back(at::tensor(flat, at::TensorOptions().dtype(at::kLong)));
    }
    GptStage base(arch, solo);
    const at::Tensor got = cached_logits(base, tokens, served);
    const at::Tensor base_alone = cached_logits(base, tokens);
    for (int64_t r : {0, 3}) CHECK(at::equal(got.select(1, r), base_alone.select(1, r)));  // untouched
    for (int i = 0; i < 2; ++i) {
      const GptStage merged = merged_model(arch, full[static_cast<size_t>(i)], configs[static_cast<size_t>(i)].lora.scale());
      for (int64_t r : of_adapter[static_cast<size_t>(i)]) {
        const at::Tensor want = cached_logits(merged, tokens.narrow(0, r, 1)).select(1, 0);
        CHECK(rel_err(got.select(1, r), want) < 1e-5);
        CHECK(rel_err(base_alone.select(1, r), want) > 1e-3);  // the adapter changes the row
      }
    }
  }
}
