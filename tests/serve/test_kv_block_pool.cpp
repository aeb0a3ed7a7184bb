// The paged KV cache's block pool and prefix cache (serve/kv_block_pool.h), in the manner of
// vLLM's tests/v1/core/test_prefix_caching.py: exact block ids, reference counts, free-queue
// order, eviction order (least recently freed first, a request's tail before its prefix),
// hash chains that differ with the parent and the extra key, and no partial-block sharing.
#include <catch2/catch.hpp>

#include <numeric>
#include <vector>

#include "serve/kv_block_pool.h"

using loom::serve::KvBlockPool;
using loom::serve::RequestBlocks;

namespace {

std::vector<int64_t> range(int64_t from, int64_t to) {
  std::vector<int64_t> v(static_cast<size_t>(to - from));
  std::iota(v.begin(), v.end(), from);
  return v;
}

std::vector<int64_t> cat(std::vector<int64_t> a, const std::vector<int64_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Runs a request of `tokens` through the pool as the engine does: cached prefix, grow to
// hold every token, then register the full blocks.
RequestBlocks admit(KvBlockPool& pool, const std::vector<int64_t>& tokens, int64_t extra = -1) {
  RequestBlocks t;
  const int64_t n = static_cast<int64_t>(tokens.size());
  pool.attach_prefix(t, tokens, extra, (n - 1) / pool.block_size());
  REQUIRE(pool.grow(t, n));
  pool.commit(t, tokens, n, extra);
  return t;
}

}  // namespace

TEST_CASE("KvBlockPool: allocation, prefix hits, reference counts and the free queue") {
  KvBlockPool pool(10, 4);
  REQUIRE(pool.num_free() == 10);
  REQUIRE(pool.free_queue() == range(0, 10));

  // A: 10 tokens = two full blocks and a partial one.
  const std::vector<int64_t> prefix = range(100, 108);
  const std::vector<int64_t> a_tokens = cat(prefix, {1, 2});
  RequestBlocks a = admit(pool, a_tokens);
  REQUIRE(a.blocks == std::vector<int64_t>{0, 1, 2});
  REQUIRE(a.committed == 2);
  REQUIRE(pool.hash_of(0).has_value());
  REQUIRE(pool.hash_of(1).has_value());
  REQUIRE_FALSE(pool.hash_of(2).has_value());  // partial: never cached
  REQUIRE(pool.free_queue() == range(3, 10));
  REQUIRE(pool.stats().hit_tokens == 0);

  // B shares A's two full blocks and has its own tail.
  const std::vector<int64_t> b_tokens = cat(prefix, {7});
  REQUIRE(pool.blocks_needed(b_tokens, -1, 2, 9) == 1);  // 3 blocks, 2 of them A's
  RequestBlocks b = admit(pool, b_tokens);
  REQUIRE(b.blocks == std::vector<int64_t>{0, 1, 3});
  REQUIRE(pool.ref_count(0) == 2);
  REQUIRE(pool.ref_count(1) == 2);
  REQUIRE(pool.ref_count(3) == 1);
  REQUIRE(pool.stats().hit_tokens == 8);
  REQUIRE(pool.stats().queried_tokens == 19);
  REQUIRE(pool.stats().lookups == 2);

  // A ends: only its own tail returns to the queue; the shared blocks stay with B.
  pool.release(a);
  REQUIRE(a.blocks.empty());
  REQUIRE(pool.ref_count(0) == 1);
  REQUIRE(pool.free_queue() == cat(range(4, 10), {2}));
  // B ends: its blocks join the tail last block first, keeping their hashes.
  pool.release(b);
  REQUIRE(pool.free_queue() == cat(range(4, 10), {2, 3, 1, 0}));
  REQUIRE(pool.hash_of(0).has_value());
  REQUIRE(pool.hash_of(1).has_value());

  // C hits the freed-but-cached blocks: they leave the free queue, and count as needed blocks.
  const std::vector<int64_t> c_tokens = cat(prefix, {9, 9, 9});
  REQUIRE(pool.blocks_needed(c_tokens, -1, 2, 11) == 3);
  RequestBlocks c = admit(pool, c_tokens);
  REQUIRE(c.blocks == std::vector<int64_t>{0, 1, 4});
  REQUIRE(pool.ref_count(0) == 1);
  REQUIRE(pool.free_queue() == cat(range(5, 10), {2, 3}));
  pool.release(c);
  REQUIRE(pool.free_queue() == cat(range(5, 10), {2, 3, 4, 1, 0}));
}

TEST_CASE("KvBlockPool: eviction takes the least recently freed block and forgets its hash") {
  KvBlockPool pool(4, 2);
  const std::vector<int64_t> tokens{5, 6, 7, 8, 9};  // blocks [5 6] [7 8], partial [9]
  RequestBlocks r = admit(pool, tokens);
  REQUIRE(r.blocks == std::vector<int64_t>{0, 1, 2});
  pool.release(r);
  REQUIRE(pool.free_queue() == std::vector<int64_t>{3, 2, 1, 0});
  // Two new blocks: the never-cached 3, then 2 (uncached tail). The prefix survives.
  RequestBlocks other;
  REQUIRE(pool.grow(other, 4));
  REQUIRE(other.blocks == std::vector<int64_t>{3, 2});
  REQUIRE(pool.match_prefix(tokens, -1, 2) == std::vector<int64_t>{0, 1});
  // One more: block 1 ([7 8]) is evicted; the prefix now ends after block 0.
  REQUIRE(pool.grow(other, 6));
  REQUIRE(other.blocks == std::vector<int64_t>{3, 2, 1});
  REQUIRE_FALSE(pool.hash_of(1).has_value());
  REQUIRE(pool.hash_of(0).has_value());
  REQUIRE(pool.match_prefix(tokens, -1, 2) == std::vector<int64_t>{0});
  // Too few free blocks: grow takes nothing and says so.
  REQUIRE_FALSE(pool.grow(other, 10));
  REQUIRE(other.blocks.size() == 3);
  REQUIRE(pool.num_free() == 1);
  REQUIRE_THROWS_AS(pool.allocate(2), std::runtime_error);
}

TEST_CASE("KvBlockPool: hash chains differ with the parent block and the extra key") {
  KvBlockPool pool(16, 4);
  const std::vector<int64_t> shared_tail{1, 2, 3, 4};
  const std::vector<int64_t> x = cat(cat({10, 11, 12, 13}, shared_tail), {0});
  const std::vector<int64_t> y = cat(cat({20, 21, 22, 23}, shared_tail), {0});
  RequestBlocks rx = admit(pool, x);
  REQUIRE(rx.blocks == std::vector<int64_t>{0, 1, 2});
  // y's second block has x's tokens but another parent: no hit, its own block and hash.
  REQUIRE(pool.match_prefix(y, -1, 2).empty());
  RequestBlocks ry = admit(pool, y);
  REQUIRE(ry.blocks == std::vector<int64_t>{3, 4, 5});
  REQUIRE(*pool.hash_of(1) != *pool.hash_of(4));
  REQUIRE(pool.match_prefix(y, -1, 2) == std::vector<int64_t>{3, 4});
  REQUIRE(pool.match_prefix(x, -1, 2) == std::vector<int64_t>{0, 1});
  // The same tokens under another extra key (a learned-prompt task) do not match.
  REQUIRE(pool.match_prefix(x, 3, 2).empty());
  RequestBlocks rt = admit(pool, x, 3);
  REQUIRE(rt.blocks == std::vector<int64_t>{6, 7, 8});
  REQUIRE(pool.match_prefix(x, 3, 2) == std::vector<int64_t>{6, 7});
  // The hash itself: parent, tokens and extra key all count.
  const int64_t t[4] = {1, 2, 3, 4};
  const uint64_t h = loom::serve::block_hash(loom::serve::kRootHash, t, 4, -1);
  REQUIRE(h == loom::serve::block_hash(loom::serve::kRootHash, t, 4, -1));
  REQUIRE(h != loom::serve::block_hash(h, t, 4, -1));
  REQUIRE(h != loom::serve::block_hash(loom::serve::kRootHash, t, 4, 0));
  REQUIRE(h != loom::serve::block_hash(loom::serve::kRootHash, t, 3, -1));
}

TEST_CASE("KvBlockPool: partial blocks are never shared, and caching can be off") {
  KvBlockPool pool(8, 4);
  const std::vector<int64_t> first{1, 2, 3, 4, 5, 6, 7};  // one full block, a partial one
  RequestBlocks a = admit(pool, first);
  REQUIRE(a.committed == 1);
  // The same 7 tokens plus more: only the full block is shared.
  const std::vector<int64_t> longer{1, 2, 3, 4, 5, 6, 7, 8, 9};
  REQUIRE(pool.match_prefix(longer, -1, 2) == std::vector<int64_t>{0});
  // A prompt of exactly one cached block with max_blocks (n - 1) / bs = 0: nothing reused (its
  // last token must be computed for the logits).
  RequestBlocks b = admit(pool, {1, 2, 3, 4});
  REQUIRE(b.blocks == std::vector<int64_t>{2});
  REQUIRE(pool.ref_count(0) == 1);

  KvBlockPool off(8, 4, /*prefix_caching=*/false);
  RequestBlocks c = admit(off, longer);
  RequestBlocks d = admit(off, longer);
  REQUIRE(c.blocks == std::vector<int64_t>{0, 1, 2});
  REQUIRE(d.blocks == std::vector<int64_t>{3, 4, 5});
  REQUIRE_FALSE(off.hash_of(0).has_value());
  REQUIRE(off.stats().hit_tokens == 0);
  REQUIRE(off.stats().queried_tokens == 18);
}

TEST_CASE("KvBlockPool: bad sizes and double frees are refused") {
  REQUIRE_THROWS_WITH(KvBlockPool(0, 16), Catch::Contains("num_blocks"));
  REQUIRE_THROWS_WITH(KvBlockPool(4, 0), Catch::Contains("block_size"));
  KvBlockPool pool(2, 2);
  REQUIRE_THROWS_AS(pool.ref_count(2), std::out_of_range);
  const auto got = pool.allocate(1);
  pool.free_blocks(got);
  REQUIRE_THROWS_AS(pool.free_blocks(got), std::logic_error);
}
