// The KV cache: logits of incremental decoding (prefill, then token by token or in chunks)
// equal the logits of the full causal forward over the same sequence, at t = 1 and t = 2, and
// the t = 2 logits gathered over the vocabulary equal the t = 1 logits. Plus the cache's errors.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <chrono>

#include "generate/token_generator.h"
#include "generate_test_util.h"
#include "harness/multiprocess.h"
#include "harness/worker_groups.h"
#include "launch/env_rendezvous.h"
#include "model/mappings.h"

using namespace loom;
using namespace loom::generate::test;

namespace {

at::Tensor test_tokens(const model::GptConfig& c, int64_t b, int64_t s) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(2024);
  return at::randint(c.vocab_size, {b, s}, gen, at::kLong);
}

at::Tensor full_forward(const model::GptStage& stage, const at::Tensor& tokens) {
  at::NoGradGuard no_grad;
  model::StageInputs in;
  in.tokens = tokens;
  in.position_ids = at::arange(tokens.size(1), at::kLong).unsqueeze(0).expand_as(tokens).contiguous();
  model::DropoutContext off;
  off.training = false;
  return stage.forward(in, off);  // [s, b, V/t]
}

// This rank's logits [s, b, V/t] of `tokens` [b, s] fed in chunks of the given sizes.
at::Tensor incremental(const model::GptStage& stage, const at::Tensor& tokens,
                       const std::vector<int64_t>& chunks) {
  model::KvCache cache = stage.make_kv_cache(tokens.size(0), tokens.size(1));
  std::vector<at::Tensor> parts;
  int64_t at = 0;
  for (int64_t c : chunks) {
    parts.push_back(stage.forward_cached(tokens.narrow(1, at, c), cache));
    at += c;
  }
  if (cache.length() != tokens.size(1)) throw std::runtime_error("cache length differs");
  return at::cat(parts, 0);
}

std::vector<std::vector<int64_t>> chunkings(int64_t s) {
  std::vector<int64_t> prefill{8};
  while (static_cast<int64_t>(prefill.size()) < s - 7) prefill.push_back(1);
  return {prefill, std::vector<int64_t>(s, 1), {s}, {5, 7, s - 12}};
}

}  // namespace

TEST_CASE("KV-cache decoding equals the full causal forward at t=1") {
  const model::GptConfig cfg = tiny_config();
  model::GptStage stage(cfg, runtime::Communicator::solo());
  set_truth(stage, 0, 1);
  const at::Tensor tokens = test_tokens(cfg, 2, 20);
  const at::Tensor want = full_forward(stage, tokens);
  for (const auto& chunks : chunkings(20)) {
    INFO("chunks " << chunks.size() << ", first " << chunks[0]);
    const at::Tensor got = incremental(stage, tokens, chunks);
    REQUIRE(got.sizes() == want.sizes());
    CHECK(rel_err(got, want) < 1e-5);
  }
  // The cache matters: the last token run alone at its position without the prefix differs.
  model::KvCache cache = stage.make_kv_cache(2, 20);
  stage.forward_cached(at::zeros({2, 19}, at::kLong), cache);  // a different prefix
  const at::Tensor last = stage.forward_cached(tokens.narrow(1, 19, 1), cache);
  CHECK(rel_err(last, want.narrow(0, 19, 1)) > 1e-2);
}

TEST_CASE("KV cache and forward_cached reject misuse") {
  const model::GptConfig cfg = tiny_config();
  model::GptStage stage(cfg, runtime::Communicator::solo());
  model::KvCache cache = stage.make_kv_cache(1, 4);
  CHECK(cache.capacity() == 4);
  CHECK_THROWS_AS(stage.forward_cached(at::zeros({1, 5}, at::kLong), cache), std::out_of_range);
  CHECK(cache.length() == 0);
  stage.forward_cached(at::zeros({1, 4}, at::kLong), cache);
  CHECK(cache.length() == 4);
  CHECK_THROWS_AS(cache.advance(1), std::out_of_range);
  CHECK_THROWS_AS(stage.forward_cached(at::zeros({2, 1}, at::kLong), cache), std::invalid_argument);
  const at::Tensor kv = at::zeros({1, 4, 1, cfg.head_dim()});
  cache.reset();
  CHECK_THROWS_AS(cache.append(cfg.num_layers, kv, kv), std::out_of_range);
  CHECK_THROWS_AS(cache.append(0, at::zeros({1, 3, 1, cfg.head_dim()}), kv), std::invalid_argument);
  auto [k, v] = cache.append(0, kv + 1, kv + 2);
  CHECK(k.size(2) == 1);
  CHECK(v.sum().item<double>() == 2.0 * cfg.head_dim() * 4);

  // Positions past max_position_embeddings.
  model::KvCache big = stage.make_kv_cache(1, 64);
  stage.forward_cached(at::zeros({1, cfg.max_position_embeddings}, at::kLong), big);
  REQUIRE_THROWS_WITH(stage.forward_cached(at::zeros({1, 1}, at::kLong), big),
                      Catch::Contains("max_position_embeddings"));
  // A first pipeline stage decodes too (loom serve keeps stages apart): tokens in, its last
  // layer's hidden states [n, b, h] out, for the next stage.
  model::GptStage first(cfg, runtime::Communicator::solo(), {0, 2, true, false});
  model::KvCache partial = first.make_kv_cache(1, 4);
  const at::Tensor hidden = first.forward_cached(at::zeros({1, 3}, at::kLong), partial);
  CHECK(hidden.sizes() == at::IntArrayRef({3, 1, cfg.hidden_size}));
  CHECK(partial.length() == 3);
}

LOOM_WORKER("generate_kv_cache_t2") {
  auto groups = loom::test::worker_groups(2);
  auto tp = groups->tensor_ptr();
  const model::GptConfig cfg = tiny_config();
  model::GptStage stage(cfg, tp);
  set_truth(stage, tp->rank(), 2);
  model::GptStage reference(cfg, runtime::Communicator::solo());
  set_truth(reference, 0, 1);

  const at::Tensor tokens = test_tokens(cfg, 2, 20);
  const at::Tensor want = full_forward(stage, tokens);
  for (const auto& chunks : chunkings(20)) {
    const at::Tensor got = incremental(stage, tokens, chunks);
    LOOM_WCHECK(rel_err(got, want) < 1e-5, + std::to_string(rel_err(got, want)));
  }
  // Gathered last-position logits equal the single-process model's (unpadded vocabulary).
  model::KvCache cache = stage.make_kv_cache(2, 20);
  const at::Tensor local = stage.forward_cached(tokens, cache);
  const at::Tensor gathered = generate::gather_last_logits(local, tp, cfg.vocab_size);
  const at::Tensor single = full_forward(reference, tokens).select(0, 19).narrow(-1, 0, cfg.vocab_size);
  LOOM_WCHECK(gathered.sizes() == single.sizes());
  LOOM_WCHECK(rel_err(gathered, single) < 1e-5, + std::to_string(rel_err(gathered, single)));

  // Sequence parallelism is a training layout: inference refuses it.
  model::GptConfig sp = cfg;
  sp.layout.sequence_parallel = true;
  model::GptStage sp_stage(sp, tp);
  model::KvCache sp_cache = sp_stage.make_kv_cache(1, 4);
  bool threw = false;
  try {
    sp_stage.forward_cached(at::zeros({1, 2}, at::kLong), sp_cache);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  LOOM_WCHECK(threw, "forward_cached accepted sequence parallelism");
  groups->shutdown();
}

TEST_CASE("KV-cache decoding at t=2 equals the full forward and the t=1 logits") {
  auto result = loom::test::run_ranks("generate_kv_cache_t2", 2);
  INFO(result.summary());
  CHECK(result.exit_code() == 0);
}
