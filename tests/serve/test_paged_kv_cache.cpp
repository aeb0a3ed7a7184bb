// The paged KV cache (model/kv_cache.h, KvCache::paged): the stage's cached forward through
// block tables (blocks scattered over the pool, rows of different lengths decoding together,
// a block shared by two rows as prefix caching shares it, flat batches of rows with different
// numbers of new positions: chunked prefill beside decodes) gives the logits of the full causal
// forward over each row's own sequence; and misuse is refused.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include "generate/generate_test_util.h"

using namespace loom;
using namespace loom::generate::test;

namespace {

at::Tensor tokens_of(const model::GptConfig& c, int64_t s, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(c.vocab_size, {1, s}, gen, at::kLong);
}

at::Tensor full_forward(const model::GptStage& stage, const at::Tensor& tokens) {
  at::NoGradGuard no_grad;
  model::StageInputs in;
  in.tokens = tokens;
  in.position_ids = at::arange(tokens.size(1), at::kLong).unsqueeze(0);
  model::DropoutContext off;
  off.training = false;
  return stage.forward(in, off).select(1, 0);  // [s, V]
}

model::KvCache paged_cache(const model::GptStage& stage, int64_t rows, int64_t blocks, int64_t block_size) {
  const auto& c = stage.config();
  return model::KvCache::paged(stage.layout().first_layer, stage.num_local_layers(), rows, blocks, block_size,
                               c.num_attention_heads, c.head_dim(), at::TensorOptions().dtype(at::kFloat));
}

}  // namespace

TEST_CASE("Paged KV cache: block-table decoding equals the full forward, rows of different lengths") {
  const auto c = tiny_config();
  model::GptStage stage(c, runtime::Communicator::solo());
  set_truth(stage, 0, 1);
  const at::Tensor a = tokens_of(c, 20, 1), b = tokens_of(c, 17, 2);
  const at::Tensor want_a = full_forward(stage, a), want_b = full_forward(stage, b);

  model::KvCache cache = paged_cache(stage, 2, 14, 4);
  REQUIRE(cache.is_paged());
  REQUIRE(cache.layer_storage(0).first.sizes() == at::IntArrayRef({14, c.num_attention_heads, 4, c.head_dim()}));
  cache.set_row(0, {9, 2, 13, 0, 5}, 0);  // 20 positions, blocks out of order
  cache.set_row(1, {1, 11, 3, 8, 6}, 0);  // 17 positions
  at::NoGradGuard no_grad;
  // Row 0 prefills 11 tokens alone, row 1 6 tokens alone; then both decode one token a step.
  std::vector<at::Tensor> got_a, got_b;
  cache.select_rows({0});
  got_a.push_back(stage.forward_cached(a.narrow(1, 0, 11), cache).select(1, 0));
  cache.select_rows({1});
  got_b.push_back(stage.forward_cached(b.narrow(1, 0, 6), cache).select(1, 0));
  cache.select_rows({1, 0});  // batch order differs from row order
  for (int64_t step = 0; step < 9; ++step) {
    const at::Tensor in = at::cat({b.narrow(1, 6 + step, 1), a.narrow(1, 11 + step, 1)}, 0);  // [2, 1]
    const at::Tensor out = stage.forward_cached(in, cache);  // [1, 2, V]
    got_b.push_back(out.select(1, 0));
    got_a.push_back(out.select(1, 1));
  }
  REQUIRE(cache.row_length(0) == 20);
  REQUIRE(cache.row_length(1) == 15);
  CHECK(rel_err(at::cat(got_a, 0), want_a) < 1e-5);
  CHECK(rel_err(at::cat(got_b, 0), want_b.narrow(0, 0, 15)) < 1e-5);
  // Row 0 is full: one more position does not fit its blocks.
  cache.select_rows({0});
  REQUIRE_THROWS_AS(stage.forward_cached(a.narrow(1, 0, 1), cache), std::out_of_range);
}

TEST_CASE("Paged KV cache: flat batches of prefill chunks and decodes equal the full forward") {
  const auto c = tiny_config();
  model::GptStage stage(c, runtime::Communicator::solo());
  set_truth(stage, 0, 1);
  const at::Tensor a = tokens_of(c, 20, 5), b = tokens_of(c, 14, 6), d = tokens_of(c, 9, 7);
  const std::vector<at::Tensor> seqs{a, b, d};
  model::KvCache cache = paged_cache(stage, 3, 16, 4);
  cache.set_row(0, {9, 2, 13, 0, 5}, 0);
  cache.set_row(1, {1, 11, 3, 8}, 0);
  cache.set_row(2, {15, 4, 7}, 0);
  at::NoGradGuard no_grad;
  // Steps of (row, new positions): chunks of different sizes, a row with none, rows in any order.
  const std::vector<std::vector<std::pair<int64_t, int64_t>>> steps{
      {{0, 7}, {1, 3}},            // two prefill chunks
      {{0, 1}, {2, 5}, {1, 6}},    // a single-token chunk, a new row, another chunk
      {{1, 5}, {2, 0}, {0, 12}},   // row 1 ends; row 2 has nothing new this time
      {{2, 4}}};                   // row 2 alone
  std::vector<std::vector<at::Tensor>> got(3);
  for (size_t s = 0; s < steps.size(); ++s) {
    std::vector<int64_t> rows, counts;
    std::vector<at::Tensor> parts;
    for (auto [row, count] : steps[s]) {
      rows.push_back(row);
      counts.push_back(count);
      parts.push_back(seqs[static_cast<size_t>(row)].narrow(1, cache.row_length(row), count));
    }
    cache.select_flat(rows, counts);
    REQUIRE(cache.batch() == 1);
    const at::Tensor out = stage.forward_cached(at::cat(parts, 1), cache).select(1, 0);  // [T, V]
    int64_t at = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      got[static_cast<size_t>(rows[i])].push_back(out.narrow(0, at, counts[i]));
      at += counts[i];
    }
  }
  for (int64_t r = 0; r < 3; ++r) {
    INFO("row " << r);
    REQUIRE(cache.row_length(r) == seqs[static_cast<size_t>(r)].size(1));
    CHECK(rel_err(at::cat(got[static_cast<size_t>(r)], 0), full_forward(stage, seqs[static_cast<size_t>(r)])) < 1e-5);
  }
  // Misuse: a count past a row's blocks, a negative count, a token count that is not the sum.
  cache.select_flat({1}, {3});
  REQUIRE_THROWS_AS(stage.forward_cached(b.narrow(1, 0, 3), cache), std::out_of_range);  // row 1 is full
  REQUIRE_THROWS_AS(cache.select_flat({0}, {-1}), std::out_of_range);
  cache.set_row(2, {15, 4, 7}, 9);
  cache.select_flat({2}, {2});
  REQUIRE_THROWS_AS(cache.positions(3, at::TensorOptions()), std::invalid_argument);
  model::KvCache contiguous = stage.make_kv_cache(1, 4);
  REQUIRE_THROWS_AS(contiguous.select_flat({0}, {1}), std::logic_error);
}

TEST_CASE("Paged KV cache: a row reusing another row's full block skips its prefix") {
  const auto c = tiny_config();
  model::GptStage stage(c, runtime::Communicator::solo());
  set_truth(stage, 0, 1);
  const at::Tensor first = tokens_of(c, 13, 3);
  at::Tensor second = tokens_of(c, 11, 4);
  second.narrow(1, 0, 8).copy_(first.narrow(1, 0, 8));  // the first two blocks of 4 are shared
  model::KvCache cache = paged_cache(stage, 2, 8, 4);
  at::NoGradGuard no_grad;
  cache.set_row(0, {4, 6, 1, 0}, 0);
  cache.select_rows({0});
  stage.forward_cached(first, cache);
  // The second request holds blocks 4 and 6 (8 cached positions) and computes only the rest.
  cache.set_row(1, {4, 6, 7}, 8);
  cache.select_rows({1});
  const at::Tensor tail = stage.forward_cached(second.narrow(1, 8, 3), cache).select(1, 0);
  CHECK(rel_err(tail, full_forward(stage, second).narrow(0, 8, 3)) < 1e-5);
}

TEST_CASE("Paged KV cache: bad rows, blocks and lengths are refused") {
  const auto c = tiny_config();
  model::GptStage stage(c, runtime::Communicator::solo());
  model::KvCache cache = paged_cache(stage, 2, 4, 4);
  REQUIRE_THROWS_AS(cache.set_row(2, {0}, 0), std::out_of_range);
  REQUIRE_THROWS_WITH(cache.set_row(0, {4}, 0), Catch::Contains("block 4"));
  REQUIRE_THROWS_AS(cache.set_row(0, {0}, 5), std::out_of_range);
  const at::Tensor kv = at::zeros({2, c.num_attention_heads, 1, c.head_dim()});
  REQUIRE_THROWS_AS(cache.append(0, kv, kv), std::logic_error);
  REQUIRE_THROWS_AS(model::KvCache::paged(0, 1, 1, 0, 16, 1, 8, at::kFloat), std::invalid_argument);
  model::KvCache contiguous = stage.make_kv_cache(1, 4);
  REQUIRE_FALSE(contiguous.is_paged());
  REQUIRE_THROWS_AS(contiguous.set_row(0, {0}, 0), std::logic_error);
}
