// paged_attention on CPU: one task per (query, head); each walks its row's keys through the
// row's block table (key j lives at slot j % block_size of block block_tables[r][j / block_size]),
// takes the causal scores in the accumulation type, a max-subtracted softmax, and the
// probability-weighted sum of the values. No [n, L] score tensor and no gathered copy of the
// keys is made. The row form (q [b, heads, n, d]) and the flat form (q [1, heads, T, d] split by
// query_starts) differ only in which row and position each query has: both are listed per
// query first. fp32 runs in vectors of the CPU's ISA (isa.h, simd.h); other dtypes in scalar
// loops over the accumulation type.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "isa.h"
#include "paged_attention.h"
#include "simd.h"

// simd.h's vectors never cross a call (all inlined), so their ABI note does not apply; the
// templates are instantiated at the end of the file, hence not a push/pop region.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace loom::ops {
namespace {

// From this many new queries in a row, that row goes through SDPA (below); measured equal at 64.
constexpr int64_t kSdpaMinQueries = 64;

struct PagedShape {
  int64_t groups, heads, per_group, d, kv_heads, block_size, max_blocks;  // q [groups, heads, per_group, d]
};

// q · k in the accumulation type over eight independent partial sums: one running sum would
// chain every multiply-add on the previous one (the compiler may not reorder a float sum), which
// made the score loop the costliest part of a prefill chunk.
template <typename acc_t, typename scalar_t>
acc_t dot(const acc_t* __restrict q, const scalar_t* __restrict k, int64_t d) {
  acc_t part[8] = {};
  int64_t c = 0;
  for (; c + 8 <= d; c += 8)
    for (int u = 0; u < 8; ++u) part[u] += q[c + u] * static_cast<acc_t>(k[c + u]);
  acc_t total = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  for (; c < d; ++c) total += q[c] * static_cast<acc_t>(k[c]);
  return total;
}

// acc += w · v in eight-wide steps over distinct arrays (the compiler then keeps them in vector
// registers; a plain loop reloaded and stored acc per element).
template <typename acc_t, typename scalar_t>
void add_scaled(acc_t* __restrict acc, acc_t w, const scalar_t* __restrict v, int64_t d) {
  int64_t c = 0;
  for (; c + 8 <= d; c += 8)
    for (int u = 0; u < 8; ++u) acc[c + u] += w * static_cast<acc_t>(v[c + u]);
  for (; c < d; ++c) acc[c] += w * static_cast<acc_t>(v[c]);
}

// The fp32 path, in vectors of the ISA that isa() picks (simd.h): the same three passes per
// query as below (scores, max-subtracted exponentials, weighted sum of values). p holds a
// query's scores padded with -inf to a multiple of 16 (the widest vector), so that whole
// vectors cover the softmax; those pads weigh 0.
struct F32Queries {
  const float *q, *keys, *values;
  const int64_t *tables, *row_of, *visible_of;
  float* out;
  PagedShape s;
  float scale;
};
constexpr int64_t kScorePad = 16;

template <typename V>
LOOM_VEC_INLINE void attend_f32_body(const F32Queries& a, int64_t begin, int64_t end, float* p, float* acc) {
  constexpr int64_t W = cpu::lanes<V>;
  const PagedShape& s = a.s;
  const int64_t d = s.d, whole = d / W * W, group = s.heads / s.kv_heads;
  const float minus_inf = -std::numeric_limits<float>::infinity();
  for (int64_t task = begin; task < end; ++task) {  // q's element order: [groups, heads, per_group]
    const int64_t g = task / (s.heads * s.per_group), h = (task / s.per_group) % s.heads;
    const int64_t t = g * s.per_group + task % s.per_group;
    const int64_t kh = h / group, visible = a.visible_of[t];
    if (visible == 0) continue;  // a query of a row that goes through SDPA
    const int64_t* table = a.tables + a.row_of[t] * s.max_blocks;
    const float* qi = a.q + task * d;
    for (int64_t blk = 0, j = 0; j < visible; ++blk) {
      const float* k = a.keys + (table[blk] * s.kv_heads + kh) * s.block_size * d;
      for (const int64_t stop = std::min(j + s.block_size, visible); j < stop; ++j, k += d) {
        V part = cpu::splat<V>(0.0f);
        for (int64_t c = 0; c < whole; c += W) part += cpu::load<V>(qi + c) * cpu::load<V>(k + c);
        float score = cpu::sum_lanes(part);
        for (int64_t c = whole; c < d; ++c) score += qi[c] * k[c];
        p[j] = score * a.scale;
      }
    }
    const int64_t padded = (visible + kScorePad - 1) / kScorePad * kScorePad;
    for (int64_t j = visible; j < padded; ++j) p[j] = minus_inf;
    V top = cpu::splat<V>(minus_inf);
    for (int64_t j = 0; j < padded; j += W) top = cpu::max(top, cpu::load<V>(p + j));
    const V mx = cpu::splat<V>(cpu::max_lanes(top));
    V total = cpu::splat<V>(0.0f);
    for (int64_t j = 0; j < padded; j += W) {
      const V e = cpu::exp(cpu::load<V>(p + j) - mx);
      cpu::store(p + j, e);
      total += e;
    }
    std::fill(acc, acc + d, 0.0f);
    for (int64_t blk = 0, j = 0; j < visible; ++blk) {
      const float* v = a.values + (table[blk] * s.kv_heads + kh) * s.block_size * d;
      for (const int64_t stop = std::min(j + s.block_size, visible); j < stop; ++j, v += d) {
        const V w = cpu::splat<V>(p[j]);
        for (int64_t c = 0; c < whole; c += W) cpu::store(acc + c, cpu::load<V>(acc + c) + w * cpu::load<V>(v + c));
        for (int64_t c = whole; c < d; ++c) acc[c] += p[j] * v[c];
      }
    }
    const float inv = 1.0f / cpu::sum_lanes(total);
    float* o = a.out + task * d;
    for (int64_t c = 0; c < d; ++c) o[c] = acc[c] * inv;
  }
}

LOOM_TARGET_AVX512 void attend_f32_avx512(const F32Queries& a, int64_t begin, int64_t end, float* p, float* acc) {
  attend_f32_body<cpu::Vec<16>>(a, begin, end, p, acc);
}
LOOM_TARGET_AVX2 void attend_f32_avx2(const F32Queries& a, int64_t begin, int64_t end, float* p, float* acc) {
  attend_f32_body<cpu::Vec<8>>(a, begin, end, p, acc);
}
void attend_f32_baseline(const F32Queries& a, int64_t begin, int64_t end, float* p, float* acc) {
  attend_f32_body<cpu::Vec<4>>(a, begin, end, p, acc);
}

// Query t (= group · per_group + index in its group) belongs to row row_of[t] and sees keys
// 0 .. visible[t] - 1.
template <typename scalar_t>
void paged_attention_queries(const scalar_t* q, const scalar_t* keys, const scalar_t* values,
                             const int64_t* tables, const std::vector<int64_t>& row_of,
                             const std::vector<int64_t>& visible_of, scalar_t* out, const PagedShape& s,
                             double scale_d) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t scale = static_cast<acc_t>(scale_d);
  const int64_t group = s.heads / s.kv_heads, tasks = s.groups * s.heads * s.per_group;
  const int64_t longest = s.max_blocks * s.block_size;
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(longest * s.d, 1));
  if constexpr (std::is_same_v<scalar_t, float>) {
    const F32Queries args{q, keys, values, tables, row_of.data(), visible_of.data(), out, s, static_cast<float>(scale_d)};
    const auto attend = cpu::pick_isa(&attend_f32_avx512, &attend_f32_avx2, &attend_f32_baseline);
    at::parallel_for(0, tasks, grain, [&](int64_t begin, int64_t end) {
      std::vector<float> p(static_cast<size_t>((longest + kScorePad - 1) / kScorePad * kScorePad));
      std::vector<float> acc(static_cast<size_t>(s.d));
      attend(args, begin, end, p.data(), acc.data());
    });
    return;
  }
  at::parallel_for(0, tasks, grain, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> p(static_cast<size_t>(longest)), acc(static_cast<size_t>(s.d)), qa(static_cast<size_t>(s.d));
    for (int64_t task = begin; task < end; ++task) {  // q's element order: [groups, heads, per_group]
      const int64_t g = task / (s.heads * s.per_group), h = (task / s.per_group) % s.heads;
      const int64_t t = g * s.per_group + task % s.per_group;
      const int64_t r = row_of[static_cast<size_t>(t)], kh = h / group;
      const int64_t visible = visible_of[static_cast<size_t>(t)];  // keys 0 .. the query's position
      if (visible == 0) continue;  // a query of a row that goes through SDPA
      const scalar_t* qi = q + task * s.d;
      const int64_t* table = tables + r * s.max_blocks;
      // f(j, offset of key j's vector in the cache) for the visible keys, block by block (no
      // division per key).
      auto each_key = [&](auto&& f) {
        for (int64_t blk = 0, j = 0; j < visible; ++blk) {
          const int64_t base = (table[blk] * s.kv_heads + kh) * s.block_size * s.d;
          const int64_t n = std::min(s.block_size, visible - j);
          for (int64_t i = 0; i < n; ++i, ++j) f(j, base + i * s.d);
        }
      };
      for (int64_t c = 0; c < s.d; ++c) qa[static_cast<size_t>(c)] = static_cast<acc_t>(qi[c]);
      acc_t mx = -std::numeric_limits<acc_t>::infinity();
      each_key([&](int64_t j, int64_t offset) {
        p[j] = dot(qa.data(), keys + offset, s.d) * scale;
        mx = std::max(mx, p[j]);
      });
      acc_t sum = 0;
      for (int64_t j = 0; j < visible; ++j) {
        p[j] = std::exp(p[j] - mx);
        sum += p[j];
      }
      std::fill(acc.begin(), acc.end(), acc_t(0));
      each_key([&](int64_t j, int64_t offset) {
        add_scaled(acc.data(), p[j], values + offset, s.d);
      });
      const acc_t inv = acc_t(1) / sum;
      scalar_t* o = out + task * s.d;
      for (int64_t c = 0; c < s.d; ++c) o[c] = static_cast<scalar_t>(acc[c] * inv);
    }
  });
}

}  // namespace

at::Tensor paged_attention_cpu(const at::Tensor& q_in, const at::Tensor& key_cache,
                               const at::Tensor& value_cache, const at::Tensor& block_tables_in,
                               const at::Tensor& context_lens_in, double scale,
                               const std::optional<at::Tensor>& query_starts) {
  internal::check_paged_attention(q_in, key_cache, value_cache, block_tables_in, context_lens_in, query_starts);
  const at::Tensor q = q_in.contiguous();
  const at::Tensor tables = block_tables_in.contiguous(), lens = context_lens_in.contiguous();
  const int64_t b = tables.size(0), max_blocks = tables.size(1), block_size = key_cache.size(2);
  const PagedShape s{q.size(0), q.size(1), q.size(2), q.size(3), key_cache.size(1), block_size, max_blocks};
  const int64_t num_blocks = key_cache.size(0), total = s.groups * s.per_group;
  const int64_t* len = lens.data_ptr<int64_t>();
  const int64_t* table = tables.data_ptr<int64_t>();
  // Row r's queries are [starts[r], starts[r + 1]) of the flat list of queries.
  std::vector<int64_t> starts(static_cast<size_t>(b + 1));
  if (query_starts) {
    const at::Tensor qs = query_starts->contiguous();
    std::copy(qs.data_ptr<int64_t>(), qs.data_ptr<int64_t>() + b + 1, starts.begin());
    TORCH_CHECK(starts[0] == 0 && starts[static_cast<size_t>(b)] == total, "loom::paged_attention: query_starts must run from 0 to ",
                total, " (q's queries), got ", starts[0], " .. ", starts[static_cast<size_t>(b)]);
  } else {
    for (int64_t r = 0; r <= b; ++r) starts[static_cast<size_t>(r)] = r * s.per_group;
  }
  for (int64_t r = 0; r < b; ++r)
    TORCH_CHECK(starts[static_cast<size_t>(r + 1)] >= starts[static_cast<size_t>(r)],
                "loom::paged_attention: query_starts must not decrease, got ", starts[static_cast<size_t>(r)], " then ",
                starts[static_cast<size_t>(r + 1)], " at row ", r);
  std::vector<int64_t> row_of(static_cast<size_t>(total)), visible_of(static_cast<size_t>(total));
  for (int64_t r = 0; r < b; ++r) {
    const int64_t first = starts[static_cast<size_t>(r)], n = starts[static_cast<size_t>(r + 1)] - first;
    TORCH_CHECK(len[r] >= n && len[r] <= max_blocks * block_size, "loom::paged_attention: row ", r, " holds ",
                len[r], " positions: expected ", n, " (the new ones) to ", max_blocks * block_size,
                " (its block table)");
    for (int64_t k = 0; k < (len[r] + block_size - 1) / block_size; ++k)
      TORCH_CHECK(table[r * max_blocks + k] >= 0 && table[r * max_blocks + k] < num_blocks,
                  "loom::paged_attention: row ", r, " names block ", table[r * max_blocks + k],
                  " outside [0, ", num_blocks, ")");
    for (int64_t i = 0; i < n; ++i) {  // query i sits at position len - n + i
      row_of[static_cast<size_t>(first + i)] = r;
      visible_of[static_cast<size_t>(first + i)] = len[r] - n + i + 1;
    }
  }
  // A row with many new queries (a prefill chunk) attends through ATen's scaled_dot_product_attention
  // over a contiguous copy of its keys and values (a blocked flash kernel on CPU; copying L
  // positions is small beside n x L scores): 2-4x faster than walking the keys per query at such n
  // (tools/bench_paged_attention.py). Its queries are marked visible 0 for the per-query kernel,
  // which does the rest.
  std::vector<int64_t> sdpa_rows;
  for (int64_t r = 0; r < b; ++r) {
    const int64_t first = starts[static_cast<size_t>(r)], n = starts[static_cast<size_t>(r + 1)] - first;
    if (n < kSdpaMinQueries) continue;
    sdpa_rows.push_back(r);
    std::fill_n(visible_of.begin() + first, n, 0);
  }
  at::Tensor out = at::empty_like(q, at::MemoryFormat::Contiguous);
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_attention_cpu", [&] {
    paged_attention_queries<scalar_t>(q.data_ptr<scalar_t>(), key_cache.data_ptr<scalar_t>(),
                                      value_cache.data_ptr<scalar_t>(), table, row_of, visible_of,
                                      out.data_ptr<scalar_t>(), s, scale);
  });
  for (int64_t r : sdpa_rows) {
    const int64_t first = starts[static_cast<size_t>(r)], n = starts[static_cast<size_t>(r + 1)] - first, L = len[r];
    const at::Tensor ids = tables[r].narrow(0, 0, (L + block_size - 1) / block_size);
    // [1, kv_heads, L, d]: the row's blocks, then heads first (selecting from a head-major view
    // of the pool instead would copy the whole pool); SDPA maps the query heads onto the kv heads
    // itself (enable_gqa).
    const auto row_of_cache = [&](const at::Tensor& cache) {
      return cache.index_select(0, ids).transpose(0, 1).reshape({1, s.kv_heads, -1, s.d}).narrow(2, 0, L);
    };
    // query i sits at position L - n + i and sees the keys up to it; a whole prompt (L = n) is
    // plain causal attention, which the flash kernel does without a mask, skipping masked blocks
    const bool whole = L == n;
    const std::optional<at::Tensor> visible =
        whole ? std::nullopt
              : std::optional<at::Tensor>(at::arange(L, lens.options()).view({1, L}) <=
                                          at::arange(L - n, L, lens.options()).view({n, 1}));
    const at::Tensor mine = query_starts ? out.narrow(2, first, n) : out.narrow(0, r, 1);
    mine.copy_(at::scaled_dot_product_attention(query_starts ? q.narrow(2, first, n) : q.narrow(0, r, 1),
                                                row_of_cache(key_cache), row_of_cache(value_cache), visible,
                                                /*dropout_p=*/0.0, /*is_causal=*/whole, scale,
                                                /*enable_gqa=*/s.kv_heads != s.heads));
  }
  return out;
}

}  // namespace loom::ops
