// Rotary CUDA kernel (extensions/src/cuda/rotary.cu) through its raw launcher, forward and
// backward, against Loom's CPU kernel and ATen: full and partial rotary, an odd head width,
// shared and per-row tables, and a strided input (a view into a wider QKV row).
#include "kernel_test_util.h"

namespace loom::cuda_test {
namespace {

TEST_CASE("rotary forward and backward match Loom's CPU kernel and ATen", "[rotary]") {
  struct Case {
    int64_t b, h, s, d, r, tb, row_pitch;  // row_pitch: elements between (b, h, s) rows, >= d
    const char* what;
  };
  const Case cases[] = {
      {2, 3, 5, 16, 16, 2, 16, "full rotary, per-row tables"},
      {1, 2, 4, 10, 6, 1, 10, "partial rotary (6 of 10), shared tables"},
      {2, 2, 3, 7, 4, 1, 7, "odd head width 7"},
      {2, 2, 3, 8, 8, 2, 24, "strided rows (a view into a QKV row of 24)"},
      {1, 1, 2, 300, 256, 1, 300, "two blocks per row"},
  };
  uint32_t seed = 900;
  for (const Case& c : cases) {
    for (DType t : kAllDTypes) {
      const int64_t rows = c.b * c.h * c.s, n = rows * c.d;
      const std::vector<float> x = random_values(t, n, seed++);
      std::vector<float> padded(static_cast<size_t>(rows * c.row_pitch), 0.0f);
      for (int64_t row = 0; row < rows; ++row)
        for (int64_t j = 0; j < c.d; ++j) padded[row * c.row_pitch + j] = x[row * c.d + j];
      // tables of independent angles (halves differ, unlike Loom's: the general formula)
      std::vector<float> cos(static_cast<size_t>(c.tb * c.s * c.r)), sin(cos.size());
      const std::vector<float> angles = random_values(DType::kFloat, cos.size(), seed++, 0.0f, 3.0f);
      for (size_t k = 0; k < cos.size(); ++k) {
        cos[k] = round_to(t, std::cos(angles[k]));
        sin[k] = round_to(t, std::sin(angles[k]));
      }
      for (bool backward : {false, true}) {
        for_each_schedule([&](const std::string& sched) {
          const std::string what = label(t, std::string(c.what) + (backward ? ", backward, " : ", ") + sched);
          DeviceArray dx(t, padded), dc(t, cos), ds(t, sin), out(t, n);
          const int64_t p = c.row_pitch;
          ops::cuda::rotary(t, dx.get(), c.h * c.s * p, c.s * p, p, dc.get(), ds.get(), out.get(), c.b,
                            c.h, c.s, c.d, c.r, c.tb, backward, nullptr);
          for (RefImpl impl : kAllRefs) {
            const auto want = rotary_ref(impl, ref_type(t), x, cos, sin, c.b, c.h, c.s, c.d, c.r, c.tb, backward);
            check_close(out.values(), want, t == DType::kFloat ? 1e-6 : 2 * dtype_eps(t), 1e-6,
                        what + " vs " + impl_name(impl));
          }
        });
      }
    }
  }
}

}  // namespace
}  // namespace loom::cuda_test
