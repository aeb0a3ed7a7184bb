// SwiGLU CUDA kernels (extensions/src/cuda/swiglu.cu) through their raw launchers, forward and
// backward, against Loom's CPU kernel and ATen, including more pairs than one grid covers.
#include "kernel_test_util.h"

namespace loom::cuda_test {
namespace {

TEST_CASE("swiglu forward and backward match Loom's CPU kernel and ATen", "[swiglu]") {
  struct Case {
    int64_t rows, f;
    const char* what;
  };
  // The simulator's grid holds 32 · sm_count blocks of 256 threads; 3 x 40000 pairs stride.
  const Case cases[] = {{5, 37, "odd width"}, {4, 1, "one pair a row"}, {3, 40000, "grid-stride loop"}};
  uint32_t seed = 1000;
  int rotate = 0;
  for (const Case& c : cases) {
    for (DType t : kAllDTypes) {
      const int64_t pairs = c.rows * c.f;
      const std::vector<float> x = random_values(t, 2 * pairs, seed++, 0.0f, 3.0f);
      const std::vector<float> dy = random_values(t, pairs, seed++);
      auto run = [&](const std::string& sched) {
        const std::string what = label(t, std::string(c.what) + ", " + sched);
        DeviceArray dx_in(t, x), ddy(t, dy), y(t, pairs), dx(t, 2 * pairs);
        ops::cuda::swiglu_forward(t, dx_in.get(), y.get(), pairs, nullptr);
        ops::cuda::swiglu_backward(t, ddy.get(), dx_in.get(), dx.get(), pairs, nullptr);
        const double rtol = t == DType::kFloat ? 1e-5 : 2 * dtype_eps(t);
        for (RefImpl impl : kAllRefs) {
          const std::string vs = what + " vs " + impl_name(impl);
          check_close(y.values(), swiglu_ref(impl, ref_type(t), {}, x, c.rows, c.f), rtol, 1e-6, "y: " + vs);
          check_close(dx.values(), swiglu_ref(impl, ref_type(t), dy, x, c.rows, c.f), rtol, 1e-6, "dx: " + vs);
        }
      };
      if (pairs > 10000)
        run(use_schedule(rotate++));
      else
        for_each_schedule(run);
    }
  }
  use_schedule(0);
}

}  // namespace
}  // namespace loom::cuda_test
