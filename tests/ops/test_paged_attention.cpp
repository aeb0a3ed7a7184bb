// paged_attention (keys and values read through block tables) against an ATen reference built
// from each row's contiguous keys and values: rows of different lengths, several new queries
// per row (prefill) and one (decode), grouped-query heads, blocks scattered in the pool in a
// random order, every float dtype; the gather-based version CUDA runs gives the same; the
// flat form (rows with different numbers of new queries, one of them none, concatenated
// without padding: chunked prefill beside decodes) gives each row's attention too; the Meta
// kernel's shapes; bad tables and query starts refused. Rows of 64+ new queries take the CPU
// kernel's SDPA path, the rest its per-query loop: both are covered.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <limits>
#include <vector>

#include "../../extensions/src/paged_attention.h"  // paged_attention_gather: CUDA's fallback
#include "loom_ops/ops.h"
#include "loom_ops/paged_attention.h"
#include "ops_test_util.h"

namespace {

// Row r's attention over its own contiguous keys k [kv_heads, len, d]: query i at position
// len - n + i sees keys j <= that position; query head h reads kv head h / (heads / kv_heads).
at::Tensor reference_row(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  const int64_t heads = q.size(0), n = q.size(1), len = k.size(1);
  const at::Tensor kk = k.repeat_interleave(heads / k.size(0), 0).to(at::kDouble);
  const at::Tensor vv = v.repeat_interleave(heads / v.size(0), 0).to(at::kDouble);
  at::Tensor s = at::matmul(q.to(at::kDouble), kk.transpose(-2, -1)) * scale;  // [heads, n, len]
  s = s.masked_fill(at::ones({n, len}, at::kBool).triu(len - n + 1), -std::numeric_limits<double>::infinity());
  return at::matmul(at::softmax(s, -1), vv);
}

struct Paged {
  at::Tensor keys, values, tables, lens;
  std::vector<at::Tensor> row_keys, row_values;  // contiguous [kv_heads, len, d]
};

// Rows of `lens` positions scattered over a pool of `num_blocks` blocks in a shuffled order.
Paged make_paged(const std::vector<int64_t>& lens, int64_t kv_heads, int64_t block_size, int64_t d,
                 int64_t num_blocks, at::ScalarType dtype) {
  Paged p;
  p.keys = at::randn({num_blocks, kv_heads, block_size, d}).to(dtype);
  p.values = at::randn({num_blocks, kv_heads, block_size, d}).to(dtype);
  int64_t max_blocks = 0;
  for (int64_t len : lens) max_blocks = std::max(max_blocks, (len + block_size - 1) / block_size);
  const at::Tensor order = at::randperm(num_blocks, at::kLong);
  p.tables = at::full({static_cast<int64_t>(lens.size()), max_blocks}, -1, at::kLong);  // unused entries: invalid
  int64_t next = 0;
  for (size_t r = 0; r < lens.size(); ++r) {
    const int64_t blocks = (lens[r] + block_size - 1) / block_size;
    std::vector<at::Tensor> ks, vs;
    for (int64_t i = 0; i < blocks; ++i) {
      const int64_t b = order[next++].item<int64_t>();
      p.tables[static_cast<int64_t>(r)][i] = b;
      ks.push_back(p.keys[b]);
      vs.push_back(p.values[b]);
    }
    p.row_keys.push_back(at::cat(ks, 1).narrow(1, 0, lens[r]));
    p.row_values.push_back(at::cat(vs, 1).narrow(1, 0, lens[r]));
  }
  p.lens = at::tensor(lens, at::kLong);
  return p;
}

}  // namespace

TEST_CASE("paged_attention matches attention over each row's contiguous cache", "[ops][paged][isa]") {
  at::manual_seed(7);
  const int64_t block_size = 4;
  const double scale = 0.35;
  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16}) {
    for (int64_t kv_heads : {4, 2}) {
      // d = 12: the generic path's 8-wide steps' tail; 64 and 20: the fp32 path's 16 lanes, whole and with a tail.
      // 18: a tail at every vector width (the baseline's 4 lanes too).
      for (auto [n, d] : {std::pair<int64_t, int64_t>{1, 8}, {3, 8}, {3, 12}, {1, 64}, {3, 20}, {2, 18}}) {
        CAPTURE(dtype, kv_heads, n, d);
        const int64_t heads = 4;
        const std::vector<int64_t> lens{3, 9, 16, 5};
        Paged p = make_paged(lens, kv_heads, block_size, d, 24, dtype);
        const at::Tensor q = at::randn({4, heads, n, d}).to(dtype);
        const at::Tensor got = loom::ops::paged_attention(q, p.keys, p.values, p.tables, p.lens, scale);
        REQUIRE(got.sizes() == q.sizes());
        REQUIRE(got.scalar_type() == dtype);
        const at::Tensor gathered = loom::ops::paged_attention_gather(q, p.keys, p.values, p.tables, p.lens, scale, std::nullopt);
        for (int64_t r = 0; r < 4; ++r) {
          CAPTURE(r);
          const at::Tensor want = reference_row(q[r], p.row_keys[r], p.row_values[r], scale);
          const double tol = dtype == at::kBFloat16 ? 2e-2 : dtype == at::kFloat ? 1e-5 : 1e-12;
          LOOM_CHECK_CLOSE(got[r], want, tol, tol);
          LOOM_CHECK_CLOSE(gathered[r], want, tol, tol);
        }
      }
    }
  }
}

TEST_CASE("paged_attention's flat form gives each row's attention of its own new queries", "[ops][paged][isa]") {
  at::manual_seed(11);
  const int64_t d = 8, block_size = 4, heads = 4;
  const double scale = 0.3;
  const std::vector<int64_t> lens{3, 9, 16, 5, 7, 90};
  // a whole prompt, a decode, a chunk, none, a prompt, a chunk long enough for the CPU's SDPA path
  const std::vector<int64_t> news{3, 1, 5, 0, 7, 70};
  std::vector<int64_t> starts{0};
  for (int64_t n : news) starts.push_back(starts.back() + n);
  const int64_t total = starts.back();
  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16}) {
    for (int64_t kv_heads : {4, 2}) {
      CAPTURE(dtype, kv_heads);
      Paged p = make_paged(lens, kv_heads, block_size, d, 48, dtype);
      const at::Tensor q = at::randn({1, heads, total, d}).to(dtype);
      const at::Tensor query_starts = at::tensor(starts, at::kLong);
      const at::Tensor got = loom::ops::paged_attention(q, p.keys, p.values, p.tables, p.lens, scale, query_starts);
      REQUIRE(got.sizes() == q.sizes());
      const at::Tensor gathered =
          loom::ops::paged_attention_gather(q, p.keys, p.values, p.tables, p.lens, scale, query_starts);
      const double tol = dtype == at::kBFloat16 ? 2e-2 : dtype == at::kFloat ? 1e-5 : 1e-12;
      // The same in chunks of 1 and of 4 queries (a budget below one query's copy, then 4 queries').
      const int64_t one_query = heads * p.tables.size(1) * block_size * (2 * d + 1) *
                                static_cast<int64_t>(at::elementSize(dtype == at::kDouble ? at::kDouble : at::kFloat));
      for (int64_t budget : {int64_t{1}, 4 * one_query}) {
        CAPTURE(budget);
        const at::Tensor chunked = loom::ops::internal::paged_attention_gather_flat(q, p.keys, p.values, p.tables,
                                                                                   p.lens, scale, query_starts, budget);
        LOOM_CHECK_CLOSE(chunked, gathered, tol, tol);
      }
      for (size_t r = 0; r < lens.size(); ++r) {
        CAPTURE(r);
        if (news[r] == 0) continue;
        const at::Tensor mine = q[0].narrow(1, starts[r], news[r]);  // [heads, n_r, d]
        const at::Tensor want = reference_row(mine, p.row_keys[r], p.row_values[r], scale);
        LOOM_CHECK_CLOSE(got[0].narrow(1, starts[r], news[r]), want, tol, tol);
        LOOM_CHECK_CLOSE(gathered[0].narrow(1, starts[r], news[r]), want, tol, tol);
      }
    }
  }
  // Bad query starts: a row with more new queries than positions, a decreasing list, the wrong
  // end, the wrong size or a q of more than one batch row.
  Paged p = make_paged({2, 3}, 2, 4, d, 4, at::kFloat);
  const at::Tensor q = at::randn({1, 2, 4, d});
  auto run = [&](std::vector<int64_t> s) {
    return loom::ops::paged_attention(q, p.keys, p.values, p.tables, p.lens, 1.0, at::tensor(s, at::kLong));
  };
  REQUIRE_THROWS_WITH(run({0, 3, 4}), Catch::Contains("row 0 holds 2 positions"));
  REQUIRE_THROWS_WITH(run({0, 5, 4}), Catch::Contains("must not decrease"));
  REQUIRE_THROWS_WITH(run({0, 1, 3}), Catch::Contains("from 0 to 4"));
  REQUIRE_THROWS_WITH(run({0, 4}), Catch::Contains("query_starts must be int64 [3]"));
  REQUIRE_THROWS_WITH(loom::ops::paged_attention(at::randn({2, 2, 2, d}), p.keys, p.values, p.tables, p.lens, 1.0,
                                                 at::tensor(std::vector<int64_t>{0, 2, 4}, at::kLong)),
                      Catch::Contains("[1, heads, T, head_dim]"));
  // Queries without any row: refused by every backend's shared check (the gather would return
  // uninitialised memory).
  const at::Tensor no_rows = at::empty({0, p.tables.size(1)}, at::kLong);
  REQUIRE_THROWS_WITH(loom::ops::paged_attention_gather(q, p.keys, p.values, no_rows, at::empty({0}, at::kLong), 1.0,
                                                        at::tensor(std::vector<int64_t>{0}, at::kLong)),
                      Catch::Contains("4 queries need at least one row"));
  const auto meta = at::TensorOptions().device(at::kMeta);
  REQUIRE(loom::ops::paged_attention(at::empty({1, 4, 6, 8}, meta), at::empty({10, 2, 16, 8}, meta),
                                     at::empty({10, 2, 16, 8}, meta), at::empty({3, 5}, meta.dtype(at::kLong)),
                                     at::empty({3}, meta.dtype(at::kLong)), 1.0,
                                     at::empty({4}, meta.dtype(at::kLong)))
              .sizes() == at::IntArrayRef({1, 4, 6, 8}));
}

TEST_CASE("paged_attention's rows of 64 or more new queries (the CPU's SDPA path) match the reference", "[ops][paged]") {
  at::manual_seed(5);
  const int64_t heads = 4, d = 16, n = 64;
  const std::vector<int64_t> lens{70, 100, 64};  // chunks at the end of a context, and a whole prompt
  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}) {
    for (int64_t kv_heads : {4, 2}) {
      CAPTURE(dtype, kv_heads);
      Paged p = make_paged(lens, kv_heads, 16, d, 24, dtype);
      const at::Tensor q = at::randn({3, heads, n, d}).to(dtype);
      const at::Tensor got = loom::ops::paged_attention(q, p.keys, p.values, p.tables, p.lens, 0.25);
      const double tol = dtype == at::kBFloat16 ? 2e-2 : dtype == at::kHalf ? 5e-3 : dtype == at::kFloat ? 1e-5 : 1e-12;
      for (int64_t r = 0; r < 3; ++r) {
        CAPTURE(r);
        LOOM_CHECK_CLOSE(got[r], reference_row(q[r], p.row_keys[r], p.row_values[r], 0.25), tol, tol);
      }
    }
  }
}

TEST_CASE("paged_attention equals core_attention on one full-length row", "[ops][paged]") {
  // With n = len the paged op is the causal attention of the training forward.
  at::manual_seed(3);
  const int64_t len = 10, d = 8, heads = 2;
  Paged p = make_paged({len}, heads, 4, d, 5, at::kFloat);
  const at::Tensor q = at::randn({1, heads, len, d});
  const at::Tensor got = loom::ops::paged_attention(q, p.keys, p.values, p.tables, p.lens, 0.3);
  const at::Tensor want = loom::ops::core_attention(q, p.row_keys[0].unsqueeze(0), p.row_values[0].unsqueeze(0),
                                                    std::nullopt, 0.3, /*causal=*/true, {});
  LOOM_CHECK_CLOSE(got, want, 1e-5, 1e-5);
}

TEST_CASE("paged_attention's Meta kernel gives the shape, and bad tables are refused", "[ops][paged]") {
  const auto meta = at::TensorOptions().device(at::kMeta);
  const at::Tensor out = loom::ops::paged_attention(
      at::empty({3, 4, 2, 8}, meta), at::empty({10, 2, 16, 8}, meta), at::empty({10, 2, 16, 8}, meta),
      at::empty({3, 5}, meta.dtype(at::kLong)), at::empty({3}, meta.dtype(at::kLong)), 1.0);
  REQUIRE(out.sizes() == at::IntArrayRef({3, 4, 2, 8}));
  REQUIRE(out.device().is_meta());
  REQUIRE_THROWS_WITH(loom::ops::paged_attention(at::empty({3, 3, 2, 8}, meta), at::empty({10, 2, 16, 8}, meta),
                                                 at::empty({10, 2, 16, 8}, meta),
                                                 at::empty({3, 5}, meta.dtype(at::kLong)),
                                                 at::empty({3}, meta.dtype(at::kLong)), 1.0),
                      Catch::Contains("multiple"));

  Paged p = make_paged({5}, 2, 4, 8, 4, at::kFloat);
  const at::Tensor q = at::randn({1, 2, 1, 8});
  at::Tensor bad = p.tables.clone();
  bad[0][1] = 4;
  REQUIRE_THROWS_WITH(loom::ops::paged_attention(q, p.keys, p.values, bad, p.lens, 1.0),
                      Catch::Contains("block 4"));
  REQUIRE_THROWS_WITH(loom::ops::paged_attention(q, p.keys, p.values, p.tables, at::tensor({9}, at::kLong), 1.0),
                      Catch::Contains("row 0"));
  REQUIRE_THROWS_WITH(loom::ops::paged_attention(q, p.keys, p.values, p.tables.to(at::kInt), p.lens, 1.0),
                      Catch::Contains("block_tables"));
}
