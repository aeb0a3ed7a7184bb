// The Llama-family pieces of the model (docs/design/llama.md) against independent references:
// RMSNorm against its formula in float64, RoPE's relative-position property, grouped-query
// attention against multi-head attention with each K/V head copied to its query heads, SwiGLU's
// interleaved gate/up rows against silu(G x) · U x, the cached decode (K/V heads only,
// positions per row) against the full forward, and the op library's fused RMSNorm / RoPE /
// SwiGLU kernels against the ATen compositions in a whole model.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "model/kv_cache.h"
#include "model/mlp.h"
#include "model/rms_norm.h"
#include "model/rotary.h"
#include "model_test_util.h"

using namespace loom;
using namespace loom::model;
using namespace loom::model::test;

namespace {

at::Tensor logits_of(const GptStage& stage, const at::Tensor& tokens) {
  at::NoGradGuard no_grad;
  StageInputs in;
  in.tokens = tokens;
  in.position_ids = at::arange(tokens.size(1), at::kLong).unsqueeze(0).expand_as(tokens).contiguous();
  DropoutContext off;
  off.training = false;
  return stage.forward(in, off);  // [s, b, V_padded]
}

at::Tensor random_tokens(const GptConfig& c, int64_t b, int64_t s, uint64_t seed = 11) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(c.vocab_size, {b, s}, gen, at::kLong);
}

at::Tensor param(const GptStage& stage, const std::string& name) {
  for (const auto& p : stage.parameters())
    if (p.name == name) return p.tensor;
  throw std::runtime_error("no parameter " + name);
}

}  // namespace

TEST_CASE("RMSNorm equals x / sqrt(mean(x^2) + eps) * w computed in float64", "[model][llama]") {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor x = at::randn({5, 2, 16}, gen) * 3 + 1;
  const at::Tensor w = at::randn({16}, gen);
  const at::Tensor x64 = x.to(at::kDouble);
  const at::Tensor want = x64 / (x64.pow(2).mean(-1, true) + 1e-6).sqrt() * w.to(at::kDouble);
  const at::Tensor got = rms_norm(x, w, 1e-6);
  CHECK(got.scalar_type() == at::kFloat);
  CHECK((got.to(at::kDouble) - want).abs().max().item<double>() < 1e-5);
  // No mean subtraction: a constant row normalises to sign(c) · w, not to zero as LayerNorm's would.
  const at::Tensor c = at::full({1, 16}, 2.0);
  CHECK(at::allclose(rms_norm(c, w, 0.0), w.unsqueeze(0), 1e-6, 1e-6));
}

TEST_CASE("RoPE: a rotated query-key product depends only on the positions' difference", "[model][llama]") {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
  const at::Tensor q = at::randn({1, 1, 1, 8}, gen).expand({1, 1, 6, 8}).contiguous();
  const at::Tensor k = at::randn({1, 1, 1, 8}, gen).expand({1, 1, 6, 8}).contiguous();
  const at::Tensor pos = at::tensor({0, 1, 3, 7, 10, 20}, at::kLong).unsqueeze(0);
  const RotaryTables tables = rotary_tables(pos, 8, 10000.0, at::kFloat);
  const at::Tensor qr = apply_rotary(q, tables)[0][0], kr = apply_rotary(k, tables)[0][0];  // [6, 8]
  auto dot = [&](int i, int j) { return (qr[i] * kr[j]).sum().item<double>(); };
  // Positions (3, 0) and (10, 7) are 3 apart; (7, 0) and (10, 3) are 7 apart.
  CHECK(std::abs(dot(2, 0) - dot(4, 3)) < 1e-4);
  CHECK(std::abs(dot(3, 0) - dot(4, 2)) < 1e-4);
  CHECK(std::abs(dot(3, 0) - dot(2, 0)) > 1e-3);  // and it does depend on the difference
  // Position 0 is the identity; the norm of each pair (i, i + d/2) is kept.
  CHECK(at::allclose(qr[0], q[0][0][0], 1e-6, 1e-6));
  const at::Tensor pairs = qr.narrow(1, 0, 4).pow(2) + qr.narrow(1, 4, 4).pow(2);
  const at::Tensor pairs0 = q[0][0].narrow(1, 0, 4).pow(2) + q[0][0].narrow(1, 4, 4).pow(2);
  CHECK(at::allclose(pairs, pairs0, 1e-5, 1e-5));
  CHECK_THROWS_WITH(rotary_tables(pos, 7, 10000.0, at::kFloat), Catch::Contains("even head dimension"));
}

TEST_CASE("grouped-query attention equals multi-head attention with each K/V head copied to its query heads",
          "[model][llama]") {
  GptConfig gqa = tiny_llama_config();  // 4 heads, 2 groups, head dim 8
  GptConfig mha = gqa;
  mha.num_query_groups = 0;
  auto solo = runtime::Communicator::solo();
  GptStage a(gqa, solo), b(mha, solo);
  const int64_t d = gqa.head_dim(), heads = gqa.num_attention_heads, per_group = heads / gqa.query_groups();
  {
    at::NoGradGuard no_grad;
    for (const auto& p : b.parameters()) {
      const bool qkv = p.name.find("linear_qkv.weight") != std::string::npos;
      if (!qkv) {
        p.tensor.copy_(param(a, p.name));
        continue;
      }
      // GQA rows per group [q (per_group · d), k (d), v (d)]; MHA rows per head [q, k, v].
      const at::Tensor src = param(a, p.name).view({gqa.query_groups(), (per_group + 2) * d, gqa.hidden_size});
      at::Tensor dst = p.tensor.view({heads, 3 * d, gqa.hidden_size});
      for (int64_t h = 0; h < heads; ++h) {
        const at::Tensor group = src[h / per_group];
        dst[h].narrow(0, 0, d).copy_(group.narrow(0, (h % per_group) * d, d));
        dst[h].narrow(0, d, 2 * d).copy_(group.narrow(0, per_group * d, 2 * d));
      }
    }
  }
  REQUIRE(param(a, "layers.0.self_attention.linear_qkv.weight").size(0) == (heads + 2 * 2) * d);
  const at::Tensor tokens = random_tokens(gqa, 2, gqa.seq_length);
  const at::Tensor la = logits_of(a, tokens), lb = logits_of(b, tokens);
  CHECK(rel_err(la, lb) < 1e-5);
  CHECK(la.abs().max().item<double>() > 0);
}

TEST_CASE("SwiGLU's interleaved fc1 rows are gate and up: fc2(silu(G x) * (U x))", "[model][llama]") {
  const GptConfig cfg = tiny_llama_config();
  auto solo = runtime::Communicator::solo();
  ParallelMlp mlp(cfg, 0, solo, at::TensorOptions().dtype(at::kFloat));
  ParamList params;
  mlp.collect(params);
  REQUIRE(params.size() == 2);  // no biases
  const at::Tensor fc1 = params[0].tensor.detach(), fc2 = params[1].tensor.detach();
  REQUIRE(fc1.size(0) == 2 * cfg.ffn());
  auto gen = at::make_generator<at::CPUGeneratorImpl>(6);
  const at::Tensor x = at::randn({4, 2, cfg.hidden_size}, gen);
  const at::Tensor gate = fc1.slice(0, 0, fc1.size(0), 2), up = fc1.slice(0, 1, fc1.size(0), 2);
  const at::Tensor want = at::linear(at::silu(at::linear(x, gate)) * at::linear(x, up), fc2);
  auto [got, bias] = mlp.forward(x);
  CHECK_FALSE(bias.defined());
  CHECK(rel_err(got.detach(), want) < 1e-6);
}

TEST_CASE("Llama cached decode (K/V heads only, RoPE positions per row) equals the full forward", "[model][llama]") {
  // Also with QKV bias, kv_channels, partial rotary and rope scaling: the decode's tables are
  // the training forward's.
  GptConfig cfg = GENERATE(tiny_llama_config(), tiny_llama_extras_config());
  cfg.hidden_dropout = cfg.attention_dropout = 0.0;
  auto solo = runtime::Communicator::solo();
  GptStage stage(cfg, solo);
  const at::Tensor tokens = random_tokens(cfg, 2, cfg.seq_length);
  const at::Tensor full = logits_of(stage, tokens);  // [s, 2, V]
  // Prefill 3, then one token at a time.
  KvCache cache = stage.make_kv_cache(2, cfg.seq_length);
  std::vector<at::Tensor> parts{stage.forward_cached(tokens.narrow(1, 0, 3), cache)};
  for (int64_t i = 3; i < cfg.seq_length; ++i) parts.push_back(stage.forward_cached(tokens.narrow(1, i, 1), cache));
  CHECK(rel_err(at::cat(parts, 0), full) < 1e-5);
  // Rows of different lengths: row 0 holds 5 positions, row 1 holds 2; one more token each
  // must see its own row's positions (RoPE rotates by them).
  KvCache rows = stage.make_kv_cache(2, cfg.seq_length);
  rows.select_rows({0});
  stage.forward_cached(tokens.narrow(0, 0, 1).narrow(1, 0, 5), rows);
  rows.select_rows({1});
  stage.forward_cached(tokens.narrow(0, 1, 1).narrow(1, 0, 2), rows);
  rows.select_rows({});
  const at::Tensor next = at::stack({tokens[0][5], tokens[1][2]}).unsqueeze(1);  // [2, 1]
  const at::Tensor got = stage.forward_cached(next, rows);                       // [1, 2, V]
  CHECK(rel_err(got[0][0], full[5][0]) < 1e-5);
  CHECK(rel_err(got[0][1], full[2][1]) < 1e-5);
}

TEST_CASE("Llama config errors name the field", "[model][llama]") {
  GptConfig cfg = tiny_llama_config();
  CHECK_NOTHROW(cfg.validate(2));
  CHECK_THROWS_WITH(cfg.validate(4), Catch::Contains("model.num_query_groups: expected a multiple of "
                                                     "tensor_model_parallel_size (4)"));
  cfg.num_query_groups = 3;
  CHECK_THROWS_WITH(cfg.validate(1), Catch::Contains("model.num_query_groups: expected a divisor of "
                                                     "num_attention_heads (4), found 3"));
  cfg = tiny_llama_config();
  cfg.rotary_percentage = 1.5;
  CHECK_THROWS_WITH(cfg.validate(1), Catch::Contains("model.rotary_percentage: expected a fraction in (0, 1]"));
  cfg.rotary_percentage = 0.2;  // int(8 * 0.2) = 1 rotated dimension
  CHECK_THROWS_WITH(cfg.validate(1), Catch::Contains("rope needs an even number >= 2 of rotated dimensions"));
  cfg = tiny_llama_config();
  cfg.rope_scaling.enabled = true;
  cfg.rope_scaling.high_freq_factor = 0.5;
  CHECK_THROWS_WITH(cfg.validate(1), Catch::Contains("model.high_freq_factor: expected 0 < low_freq_factor < "
                                                     "high_freq_factor"));
  // The parameter set: no biases, no position table, RMSNorm weights only, an output layer.
  auto solo = runtime::Communicator::solo();
  std::set<std::string> names;
  for (const auto& p : GptStage(tiny_llama_config(), solo).parameters()) names.insert(p.name);
  CHECK(names.count("output_layer.weight"));
  CHECK_FALSE(names.count("embedding.position_embeddings.weight"));
  for (const auto& n : names) CHECK(n.find(".bias") == std::string::npos);
}

TEST_CASE("qkv_bias: a bias on the QKV projection only, kv_channels: heads wider than hidden / heads",
          "[model][llama]") {
  auto solo = runtime::Communicator::solo();
  std::set<std::string> biases;
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& p : GptStage(tiny_llama_extras_config(), solo).parameters()) {
    if (p.name.find(".bias") != std::string::npos) biases.insert(p.name);
    shapes[p.name] = p.tensor.sizes().vec();
  }
  CHECK(biases == std::set<std::string>{"layers.0.self_attention.linear_qkv.bias", "layers.1.self_attention.linear_qkv.bias",
                                        "layers.2.self_attention.linear_qkv.bias"});
  // 4 query heads and 2 K/V heads of 16: QKV [(4 + 2·2)·16, 32], projection [32, 4·16].
  CHECK(shapes.at("layers.0.self_attention.linear_qkv.weight") == std::vector<int64_t>{128, 32});
  CHECK(shapes.at("layers.0.self_attention.linear_qkv.bias") == std::vector<int64_t>{128});
  CHECK(shapes.at("layers.0.self_attention.linear_proj.weight") == std::vector<int64_t>{32, 64});
}

TEST_CASE("partial rotary rotates the leading rotary_percentage of each head as Megatron-Core defines it",
          "[model][llama]") {
  // Megatron-Core (rotary_pos_embedding.py, _apply_rotary_pos_emb_bshd): r = int(d · p) dims,
  // inverse frequencies base^(-2i/r), rotate-half within the r dims, the rest unchanged.
  GptConfig cfg = tiny_llama_config();
  cfg.kv_channels = 12;
  cfg.rotary_percentage = 0.75;  // 9 rotated dimensions: rotate-half needs an even number
  CHECK_THROWS_WITH(cfg.validate(1), Catch::Contains("rope needs an even number >= 2 of rotated dimensions"));
  cfg.rotary_percentage = 0.5;
  REQUIRE(cfg.rotary_dim() == 6);
  CHECK_NOTHROW(cfg.validate(1));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor x = at::randn({2, 3, 5, 12}, gen, at::kDouble);
  const at::Tensor pos = at::arange(5, at::kLong).add(7).unsqueeze(0).expand({2, 5}).contiguous();
  const at::Tensor got = apply_rotary(x.to(at::kFloat), rotary_tables(pos, cfg, at::kFloat)).to(at::kDouble);
  at::Tensor want = x.clone();
  for (int64_t i = 0; i < 3; ++i) {
    const double f = std::pow(cfg.rotary_base, -2.0 * i / 6.0);
    const at::Tensor angle = (pos.to(at::kDouble) * f).unsqueeze(1);  // [2, 1, 5]
    const at::Tensor a = x.select(-1, i), b = x.select(-1, i + 3);
    want.select(-1, i).copy_(a * angle.cos() - b * angle.sin());
    want.select(-1, i + 3).copy_(b * angle.cos() + a * angle.sin());
  }
  CHECK(at::allclose(got, want, 1e-5, 1e-5));
  CHECK(at::equal(got.narrow(-1, 6, 6), x.narrow(-1, 6, 6).to(at::kFloat).to(at::kDouble)));  // passed through
}

TEST_CASE("Llama 3.1 rope scaling: each inverse frequency kept, interpolated or divided by its band",
          "[model][llama]") {
  GptConfig cfg = tiny_llama_config();
  cfg.kv_channels = 16;
  cfg.rotary_base = 1000.0;
  cfg.rope_scaling = {true, 4.0, 1.0, 4.0, 32};  // wavelengths < 8 kept, > 32 divided by 4
  const at::Tensor got = rotary_inverse_frequencies(cfg, at::kCPU).to(at::kDouble);
  const RopeScaling off;
  cfg.rope_scaling = off;
  const at::Tensor plain = rotary_inverse_frequencies(cfg, at::kCPU).to(at::kDouble);
  REQUIRE(got.size(0) == 8);
  int kept = 0, interpolated = 0, divided = 0;
  for (int64_t i = 0; i < 8; ++i) {
    const double f = plain[i].item<double>(), w = 2 * M_PI / f;
    double want = f;
    if (w > 32.0) {
      want = f / 4.0;
      ++divided;
    } else if (w >= 8.0) {
      const double s = (32.0 / w - 1.0) / (4.0 - 1.0);
      want = (1 - s) * f / 4.0 + s * f;
      ++interpolated;
    } else {
      ++kept;
    }
    CHECK(got[i].item<double>() == Approx(want).epsilon(1e-6));
  }
  CHECK(kept >= 1);
  CHECK(interpolated >= 1);
  CHECK(divided >= 1);
}

TEST_CASE("the fused RMSNorm, RoPE and SwiGLU kernels give the ATen compositions' loss and gradients",
          "[model][llama]") {
  // persist_layer_norm / apply_rope_fusion / bias_activation_fusion (on by default) against all
  // three off; the extras config adds partial rotary, rope scaling and a QKV bias; the biased
  // GPT config runs loom::layer_norm and loom::bias_gelu against at::layer_norm and at::gelu.
  GptConfig fused = GENERATE(tiny_llama_config(), tiny_llama_extras_config(), tiny_config());
  CAPTURE(fused.normalization == Normalization::kRmsNorm, fused.rotary_percentage);
  REQUIRE((fused.persist_layer_norm && fused.apply_rope_fusion && fused.bias_activation_fusion));
  GptConfig plain = fused;
  plain.persist_layer_norm = plain.apply_rope_fusion = plain.bias_activation_fusion = false;
  auto solo = runtime::Communicator::solo();
  DropoutContext off;
  off.training = false;
  const Batch batch = make_batch(fused, 2);
  const Result want = run_step(GptStage(plain, solo), batch, off, *solo);
  const Result got = run_step(GptStage(fused, solo), batch, off, *solo);
  CHECK(rel_err(got.loss, want.loss) < 1e-6);
  REQUIRE(got.grads.size() == want.grads.size());
  for (const auto& [name, g] : want.grads) {
    INFO(name);
    CHECK(rel_err(got.grads.at(name), g) < 1e-5);
  }
}
