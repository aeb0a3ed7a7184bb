// paged_attention CUDA kernel (extensions/src/cuda/paged_attention.cu) through its raw
// launcher, against Loom's CPU kernel and an ATen gather of each row's blocks: rows of
// different lengths (one shorter than a block, one ending on a block edge), decode (n = 1) and
// prefill (n = 3), grouped-query heads, blocks scattered over the pool, every dtype, every
// simulator schedule; and the flat form (rows with different numbers of new queries, one with
// none, in one batch row split by query starts: chunked prefill beside decodes).
#include "kernel_test_util.h"

#include "cuda/paged_attention_launcher.h"

#include <algorithm>
#include <numeric>

namespace loom::cuda_test {
namespace {

struct PagedCase {
  int64_t heads, kv_heads, n, d, block_size;
  std::vector<int64_t> lens;
  const char* what;
  std::vector<int64_t> news = {};  // the flat form: new queries per row (n is their sum)
};

TEST_CASE("paged_attention_forward matches Loom's CPU kernel and ATen", "[paged_attention]") {
  const PagedCase cases[] = {
      {4, 4, 1, 8, 4, {3, 9, 16, 5}, "decode, rows of 3..16 positions"},
      {4, 2, 3, 8, 4, {3, 12, 7}, "prefill of 3, grouped-query heads"},
      {2, 1, 2, 40, 16, {2, 33}, "head_dim 40 (more than a warp of columns), 16-token blocks"},
      {1, 1, 1, 4, 2, {200}, "a row longer than the block of threads"},
      {4, 2, 9, 8, 4, {3, 12, 7, 5}, "flat: a prompt, a decode, a chunk, no query", {3, 1, 5, 0}},
      {2, 2, 9, 8, 4, {9, 1}, "flat: a prompt behind an empty-context decode", {8, 1}},
  };
  uint32_t seed = 11;
  const float scale = 0.4f;
  for (const PagedCase& c : cases) {
    const int64_t b = static_cast<int64_t>(c.lens.size());
    int64_t max_blocks = 0, total = 0;
    for (int64_t len : c.lens) {
      max_blocks = std::max(max_blocks, (len + c.block_size - 1) / c.block_size);
      total += (len + c.block_size - 1) / c.block_size;
    }
    const int64_t num_blocks = total + 3;  // spare blocks the tables never name
    std::vector<int64_t> order(static_cast<size_t>(num_blocks));
    std::iota(order.begin(), order.end(), int64_t{0});
    std::reverse(order.begin(), order.end());
    std::rotate(order.begin(), order.begin() + 1, order.end());
    std::vector<int64_t> tables(static_cast<size_t>(b * max_blocks), 0);
    for (int64_t r = 0, next = 0; r < b; ++r)
      for (int64_t i = 0; i < (c.lens[r] + c.block_size - 1) / c.block_size; ++i)
        tables[static_cast<size_t>(r * max_blocks + i)] = order[static_cast<size_t>(next++)];
    const int64_t cache_elems = num_blocks * c.kv_heads * c.block_size * c.d;
    const bool flat = !c.news.empty();
    std::vector<int64_t> starts;
    if (flat) {
      starts.push_back(0);
      for (int64_t n : c.news) starts.push_back(starts.back() + n);
      REQUIRE(starts.back() == c.n);
    }
    const int64_t q_elems = (flat ? 1 : b) * c.heads * c.n * c.d;
    for (DType t : kAllDTypes) {
      const std::vector<float> q = random_values(t, q_elems, seed++);
      const std::vector<float> k = random_values(t, cache_elems, seed++);
      const std::vector<float> v = random_values(t, cache_elems, seed++);
      for_each_schedule([&](const std::string& sched) {
        const std::string what = label(t, std::string(c.what) + ", " + sched);
        DeviceArray dq(t, q), dk(t, k), dv(t, v), out(t, q_elems);
        DeviceBuffer dtables(tables.size() * sizeof(int64_t)), dlens(c.lens.size() * sizeof(int64_t));
        DeviceBuffer dstarts(std::max<size_t>(starts.size(), 1) * sizeof(int64_t));
        dtables.upload(tables.data());
        dlens.upload(c.lens.data());
        if (flat) dstarts.upload(starts.data());
        ops::cuda::paged_attention_forward(t, dq.get(), dk.get(), dv.get(), static_cast<int64_t*>(dtables.get()),
                                           static_cast<int64_t*>(dlens.get()),
                                           flat ? static_cast<int64_t*>(dstarts.get()) : nullptr, out.get(), b,
                                           c.heads, c.n, c.d,
                                           c.kv_heads, c.block_size, max_blocks, scale, nullptr);
        const std::vector<float> got = out.values();
        const double tol = t == DType::kFloat ? 1e-5 : 4 * dtype_eps(t);
        for (RefImpl impl : kAllRefs)
          check_close(got,
                      paged_attention_ref(impl, ref_type(t), q, k, v, tables, c.lens, b, c.heads, c.n, c.d,
                                          num_blocks, c.kv_heads, c.block_size, scale, starts),
                      tol, tol, "out: " + what + " vs " + impl_name(impl));
      });
    }
  }
}

}  // namespace
}  // namespace loom::cuda_test
