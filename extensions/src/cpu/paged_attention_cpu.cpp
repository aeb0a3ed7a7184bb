// paged_attention on CPU: one task per (row, head, query); each walks the row's keys through
// its block table (key j lives at slot j % block_size of block block_tables[r][j / block_size]),
// takes the causal scores in the accumulation type, a max-subtracted softmax, and the
// probability-weighted sum of the values. No [n, L] score tensor and no gathered copy of the
// keys is made.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>
#include <vector>

#include "paged_attention.h"

namespace loom::ops {
namespace {

struct PagedShape {
  int64_t b, heads, n, d, kv_heads, block_size, max_blocks;
};

template <typename scalar_t>
void paged_attention_rows(const scalar_t* q, const scalar_t* keys, const scalar_t* values,
                          const int64_t* tables, const int64_t* lens, scalar_t* out,
                          const PagedShape& s, double scale_d) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t scale = static_cast<acc_t>(scale_d);
  const int64_t group = s.heads / s.kv_heads, tasks = s.b * s.heads * s.n;
  const int64_t longest = s.max_blocks * s.block_size;
  at::parallel_for(0, tasks, std::max<int64_t>(1, 4096 / std::max<int64_t>(longest * s.d, 1)),
                   [&](int64_t begin, int64_t end) {
    std::vector<acc_t> p(static_cast<size_t>(longest)), acc(static_cast<size_t>(s.d));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t r = task / (s.heads * s.n), h = (task / s.n) % s.heads, i = task % s.n;
      const int64_t kh = h / group;
      const int64_t visible = lens[r] - s.n + i + 1;  // keys 0 .. position of query i
      const scalar_t* qi = q + task * s.d;
      const int64_t* table = tables + r * s.max_blocks;
      auto slot = [&](int64_t j) {  // offset of key j's vector in the cache
        return ((table[j / s.block_size] * s.kv_heads + kh) * s.block_size + j % s.block_size) * s.d;
      };
      acc_t mx = -std::numeric_limits<acc_t>::infinity();
      for (int64_t j = 0; j < visible; ++j) {
        const scalar_t* kj = keys + slot(j);
        acc_t dot = 0;
        for (int64_t c = 0; c < s.d; ++c) dot += static_cast<acc_t>(qi[c]) * static_cast<acc_t>(kj[c]);
        p[j] = dot * scale;
        mx = std::max(mx, p[j]);
      }
      acc_t sum = 0;
      for (int64_t j = 0; j < visible; ++j) {
        p[j] = std::exp(p[j] - mx);
        sum += p[j];
      }
      std::fill(acc.begin(), acc.end(), acc_t(0));
      for (int64_t j = 0; j < visible; ++j) {
        const scalar_t* vj = values + slot(j);
        const acc_t w = p[j];
        for (int64_t c = 0; c < s.d; ++c) acc[c] += w * static_cast<acc_t>(vj[c]);
      }
      const acc_t inv = acc_t(1) / sum;
      scalar_t* o = out + task * s.d;
      for (int64_t c = 0; c < s.d; ++c) o[c] = static_cast<scalar_t>(acc[c] * inv);
    }
  });
}

}  // namespace

at::Tensor paged_attention_cpu(const at::Tensor& q_in, const at::Tensor& key_cache,
                               const at::Tensor& value_cache, const at::Tensor& block_tables_in,
                               const at::Tensor& context_lens_in, double scale) {
  internal::check_paged_attention(q_in, key_cache, value_cache, block_tables_in, context_lens_in);
  const at::Tensor q = q_in.contiguous();
  const at::Tensor tables = block_tables_in.contiguous(), lens = context_lens_in.contiguous();
  const PagedShape s{q.size(0), q.size(1), q.size(2), q.size(3), key_cache.size(1), key_cache.size(2),
                     tables.size(1)};
  const int64_t num_blocks = key_cache.size(0);
  const int64_t* len = lens.data_ptr<int64_t>();
  const int64_t* table = tables.data_ptr<int64_t>();
  for (int64_t r = 0; r < s.b; ++r) {
    TORCH_CHECK(len[r] >= s.n && len[r] <= s.max_blocks * s.block_size, "loom::paged_attention: row ", r,
                " holds ", len[r], " positions: expected ", s.n, " (the new ones) to ",
                s.max_blocks * s.block_size, " (its block table)");
    for (int64_t k = 0; k < (len[r] + s.block_size - 1) / s.block_size; ++k)
      TORCH_CHECK(table[r * s.max_blocks + k] >= 0 && table[r * s.max_blocks + k] < num_blocks,
                  "loom::paged_attention: row ", r, " names block ", table[r * s.max_blocks + k],
                  " outside [0, ", num_blocks, ")");
  }
  at::Tensor out = at::empty_like(q, at::MemoryFormat::Contiguous);
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_attention_cpu", [&] {
    paged_attention_rows<scalar_t>(q.data_ptr<scalar_t>(), key_cache.data_ptr<scalar_t>(),
                                   value_cache.data_ptr<scalar_t>(), table, len,
                                   out.data_ptr<scalar_t>(), s, scale);
  });
  return out;
}

}  // namespace loom::ops
