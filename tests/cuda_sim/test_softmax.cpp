// Scaled masked softmax CUDA kernels (extensions/src/cuda/softmax.cu) through their raw
// launchers, against Loom's CPU kernel and ATen. Tiny shapes make the mask structure exact:
// every masked probability must be exactly 0 and every unmasked one positive.
#include "kernel_test_util.h"

namespace loom::cuda_test {
namespace {

struct SoftmaxCase {
  int64_t b, a, sq, sk;
  bool causal;
  bool padding;  // a [b, 1, sq, sk] mask: padded keys per batch, one fully masked query row
  size_t misalign;
  const char* what;
};

double out_rtol(DType t) { return t == DType::kFloat ? 1e-5 : 2 * dtype_eps(t); }

/// [b, 1, sq, sk]: batch bi masks keys from sk - 1 - 2 bi on, and all keys of query 1.
std::vector<uint8_t> padding_mask(const SoftmaxCase& c) {
  std::vector<uint8_t> m(c.b * c.sq * c.sk, 0);
  for (int64_t bi = 0; bi < c.b; ++bi)
    for (int64_t q = 0; q < c.sq; ++q)
      for (int64_t k = 0; k < c.sk; ++k)
        m[(bi * c.sq + q) * c.sk + k] = (k >= c.sk - 1 - 2 * bi || q == 1) ? 1 : 0;
  return m;
}

TEST_CASE("softmax_forward matches Loom's CPU kernel and ATen, masks exactly", "[softmax]") {
  const SoftmaxCase cases[] = {
      {1, 2, 4, 6, true, false, 0, "causal, sq=4 sk=6"},
      {1, 1, 6, 4, true, false, 0, "causal with sk < sq (first rows fully masked)"},
      {2, 2, 5, 37, false, true, 0, "padding mask with a fully masked row, row of 37"},
      {2, 2, 4, 64, true, true, 0, "padding and causal masks, vector path"},
      {1, 2, 3, 64, false, false, 1, "misaligned pointers"},
      {1, 1, 2, 4200, true, false, 0, "row longer than the register cache"},
  };
  uint32_t seed = 7;
  const float scale = 0.7f;
  for (const SoftmaxCase& c : cases) {
    const int64_t rows = c.b * c.a * c.sq, n = rows * c.sk;
    const std::vector<uint8_t> mask = c.padding ? padding_mask(c) : std::vector<uint8_t>{};
    std::vector<int64_t> mask_rows;  // as the op's glue computes them (a broadcast)
    for (int64_t bi = 0; bi < c.b; ++bi)
      for (int64_t ai = 0; ai < c.a; ++ai)
        for (int64_t q = 0; q < c.sq; ++q) mask_rows.push_back((bi * c.sq + q) * c.sk);
    auto masked = [&](int64_t row, int64_t k) {
      const int64_t q = row % c.sq, bi = row / (c.a * c.sq);
      if (c.causal && k > q + (c.sk - c.sq)) return true;
      return c.padding && mask[(bi * c.sq + q) * c.sk + k] != 0;
    };
    for (DType t : kAllDTypes) {
      const std::vector<float> x = random_values(t, n, seed++);
      for_each_schedule([&](const std::string& sched) {
        const std::string what = label(t, std::string(c.what) + ", " + sched);
        DeviceArray dx(t, x, c.misalign), y(t, n, c.misalign);
        DeviceBuffer dmask(mask.size()), drows(mask_rows.size() * sizeof(int64_t));
        if (c.padding) {
          dmask.upload(mask.data());
          drows.upload(mask_rows.data());
        }
        const bool* m = c.padding ? static_cast<bool*>(dmask.get()) : nullptr;
        const int64_t* mr = c.padding ? static_cast<int64_t*>(drows.get()) : nullptr;
        ops::cuda::softmax_forward(t, dx.get(), m, mr, y.get(), rows, c.sq, c.sk, scale, c.causal,
                                   nullptr);
        const std::vector<float> got = y.values();
        for (RefImpl impl : kAllRefs)
          check_close(got, softmax_ref(impl, ref_type(t), x, mask, c.b, c.a, c.sq, c.sk, scale,
                                       c.causal),
                      out_rtol(t), 1e-6, "y: " + what + " vs " + impl_name(impl));
        int64_t wrong = 0, first = -1;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t k = 0; k < c.sk; ++k) {
            bool row_all_masked = true;
            for (int64_t j = 0; j < c.sk; ++j) row_all_masked = row_all_masked && masked(r, j);
            const float v = got[r * c.sk + k];
            const bool ok = masked(r, k) || row_all_masked ? v == 0.0f : v > 0.0f;
            if (!ok && wrong++ == 0) first = r * c.sk + k;
          }
        INFO(what << ": masked probabilities must be exactly 0, unmasked ones positive; first "
                     "wrong element (row, key) = ("
                  << first / c.sk << ", " << first % c.sk << ")");
        CHECK(wrong == 0);
      });
    }
  }
}

TEST_CASE("softmax_backward matches Loom's CPU kernel and ATen", "[softmax]") {
  struct Case {
    int64_t rows, sk;
    size_t misalign;
    const char* what;
  };
  const Case cases[] = {
      {6, 37, 0, "row of 37"},
      {4, 64, 0, "vector path"},
      {3, 64, 1, "misaligned pointers"},
      {2, 4200, 0, "row longer than the register cache"},
  };
  uint32_t seed = 70;
  const float scale = 1.3f;
  for (const Case& c : cases) {
    for (DType t : kAllDTypes) {
      std::vector<float> y = random_values(DType::kFloat, c.rows * c.sk, seed++);
      for (int64_t r = 0; r < c.rows; ++r) {  // rows of probabilities
        double sum = 0;
        for (int64_t k = 0; k < c.sk; ++k) sum += std::exp(y[r * c.sk + k]);
        for (int64_t k = 0; k < c.sk; ++k)
          y[r * c.sk + k] = round_to(t, static_cast<float>(std::exp(y[r * c.sk + k]) / sum));
      }
      const std::vector<float> dy = random_values(t, c.rows * c.sk, seed++);
      for_each_schedule([&](const std::string& sched) {
        const std::string what = label(t, std::string(c.what) + ", " + sched);
        DeviceArray ddy(t, dy, c.misalign), dy_(t, y, c.misalign), dx(t, c.rows * c.sk, c.misalign);
        ops::cuda::softmax_backward(t, ddy.get(), dy_.get(), dx.get(), c.rows, c.sk, scale,
                                    nullptr);
        for (RefImpl impl : kAllRefs)
          check_close(dx.values(),
                      softmax_backward_ref(impl, ref_type(t), dy, y, c.rows, c.sk, scale),
                      out_rtol(t), 1e-6, "dx: " + what + " vs " + impl_name(impl));
      });
    }
  }
}

}  // namespace
}  // namespace loom::cuda_test
