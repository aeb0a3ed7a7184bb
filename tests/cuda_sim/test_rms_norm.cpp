// RMSNorm CUDA kernels (the kRms instances of extensions/src/cuda/layer_norm.cu) through their
// raw launchers, against Loom's CPU kernel and ATen, for every element type and schedule.
#include "kernel_test_util.h"

namespace loom::cuda_test {
namespace {

struct RmsCase {
  int64_t rows, cols;
  size_t misalign;  // elements past an aligned base, for every pointer
  const char* what;
};

constexpr float kEps = 1e-6f;

double out_rtol(DType t) { return t == DType::kFloat ? 1e-5 : 2 * dtype_eps(t); }

TEST_CASE("rms_norm_forward matches Loom's CPU kernel and ATen", "[rms_norm]") {
  const RmsCase cases[] = {
      {5, 37, 0, "row of 37 (a partial pack)"},
      {3, 1024, 0, "16-byte vector path"},
      {4, 64, 1, "misaligned pointers (element path)"},
      {2, 16400, 0, "row longer than the register cache (re-read tail)"},
  };
  uint32_t seed = 700;
  int rotate = 0;
  for (const RmsCase& c : cases) {
    for (DType t : kAllDTypes) {
      const std::vector<float> x = random_values(t, c.rows * c.cols, seed++, 0.5f, 2.0f);
      const std::vector<float> gamma = random_values(DType::kFloat, c.cols, seed++, 1.0f, 0.3f);
      auto run = [&](const std::string& sched) {
        const std::string what = label(t, std::string(c.what) + ", " + sched);
        DeviceArray dx(t, x, c.misalign), dg(DType::kFloat, gamma, c.misalign);
        DeviceArray y(t, c.rows * c.cols, c.misalign), rstd(DType::kFloat, c.rows, c.misalign);
        ops::cuda::rms_norm_forward(t, dx.get(), dg.ptr<float>(), y.get(), rstd.ptr<float>(),
                                    c.rows, c.cols, kEps, nullptr);
        for (RefImpl impl : kAllRefs) {
          const RmsNormRef ref = rms_norm_ref(impl, ref_type(t), x, gamma, c.rows, c.cols, kEps);
          const std::string vs = what + " vs " + impl_name(impl);
          check_close(y.values(), ref.y, out_rtol(t), 1e-5, "y: " + vs);
          check_close(rstd.values(), ref.rstd, 1e-5, 1e-6, "rstd: " + vs);
        }
      };
      if (c.cols > 16384)
        run(use_schedule(rotate++));
      else
        for_each_schedule(run);
    }
  }
  use_schedule(0);
}

TEST_CASE("rms_norm_backward matches Loom's CPU kernel and ATen", "[rms_norm]") {
  const RmsCase cases[] = {
      {5, 37, 0, "fused, row of 37 (a partial pack)"},
      {13, 1000, 0, "fused, two warps, rows strided over the blocks"},
      {4, 64, 1, "fused, misaligned pointers"},
      {3, 16400, 0, "unfused (row longer than the fused kernel's cache)"},
  };
  uint32_t seed = 800;
  int rotate = 0;
  for (const RmsCase& c : cases) {
    for (DType t : kAllDTypes) {
      const std::vector<float> x = random_values(t, c.rows * c.cols, seed++, 0.5f, 2.0f);
      const std::vector<float> dy = random_values(t, c.rows * c.cols, seed++);
      const std::vector<float> gamma = random_values(DType::kFloat, c.cols, seed++, 1.0f, 0.3f);
      const RmsNormRef fwd = rms_norm_ref(RefImpl::kLoomCpu, ref_type(t), x, gamma, c.rows, c.cols, kEps);
      auto run = [&](const std::string& sched) {
        const std::string what = label(t, std::string(c.what) + ", " + sched);
        DeviceArray ddy(t, dy, c.misalign), dx_in(t, x, c.misalign),
            drstd(DType::kFloat, fwd.rstd, c.misalign), dg(DType::kFloat, gamma, c.misalign);
        DeviceArray dx(t, c.rows * c.cols, c.misalign), dgamma(DType::kFloat, c.cols, c.misalign);
        DeviceArray ws(DType::kFloat, ops::cuda::layer_norm_backward_workspace(c.rows, c.cols));
        ops::cuda::rms_norm_backward(t, ddy.get(), dx_in.get(), drstd.ptr<float>(), dg.ptr<float>(),
                                     dx.get(), dgamma.ptr<float>(), ws.ptr<float>(), c.rows, c.cols,
                                     nullptr);
        for (RefImpl impl : kAllRefs) {
          const RmsNormGradRef ref =
              rms_norm_backward_ref(impl, ref_type(t), dy, x, gamma, fwd.rstd, c.rows, c.cols);
          const std::string vs = what + " vs " + impl_name(impl);
          check_close(dx.values(), ref.dx, out_rtol(t), 1e-4, "dx: " + vs);
          check_close(dgamma.values(), ref.dgamma, 1e-4, 1e-4, "dgamma: " + vs);
        }
      };
      if (c.cols > 16384)
        run(use_schedule(rotate++));
      else
        for_each_schedule(run);
    }
  }
  use_schedule(0);
}

}  // namespace
}  // namespace loom::cuda_test
