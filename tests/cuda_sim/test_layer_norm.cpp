// LayerNorm CUDA kernels (extensions/src/cuda/layer_norm.cu) through their raw launchers,
// against Loom's CPU kernel and ATen, for every element type and every simulator schedule.
#include "kernel_test_util.h"

namespace loom::cuda_test {
namespace {

struct LnCase {
  int64_t rows, cols;
  size_t misalign;  // elements past an aligned base, for every pointer
  const char* what;
};

constexpr float kEps = 1e-5f;

double out_rtol(DType t) { return t == DType::kFloat ? 1e-5 : 2 * dtype_eps(t); }

TEST_CASE("layer_norm_forward matches Loom's CPU kernel and ATen", "[layer_norm]") {
  const LnCase cases[] = {
      {5, 37, 0, "row of 37 (a partial pack)"},
      {3, 1024, 0, "16-byte vector path"},
      {4, 64, 1, "misaligned pointers (element path)"},
      {2, 16400, 0, "row longer than the register cache (re-read tail)"},
  };
  uint32_t seed = 1;
  for (const LnCase& c : cases) {
    for (DType t : kAllDTypes) {
      const std::vector<float> x = random_values(t, c.rows * c.cols, seed++, 0.5f, 2.0f);
      const std::vector<float> gamma = random_values(DType::kFloat, c.cols, seed++, 1.0f, 0.3f);
      const std::vector<float> beta = random_values(DType::kFloat, c.cols, seed++, 0.0f, 0.3f);
      for_each_schedule([&](const std::string& sched) {
        const std::string what = label(t, std::string(c.what) + ", " + sched);
        DeviceArray dx(t, x, c.misalign), dg(DType::kFloat, gamma, c.misalign),
            db(DType::kFloat, beta, c.misalign);
        DeviceArray y(t, c.rows * c.cols, c.misalign), mean(DType::kFloat, c.rows, c.misalign),
            rstd(DType::kFloat, c.rows, c.misalign);
        ops::cuda::layer_norm_forward(t, dx.get(), dg.ptr<float>(), db.ptr<float>(), y.get(),
                                      mean.ptr<float>(), rstd.ptr<float>(), c.rows, c.cols, kEps,
                                      nullptr);
        for (RefImpl impl : kAllRefs) {
          const LayerNormRef ref =
              layer_norm_ref(impl, ref_type(t), x, gamma, beta, c.rows, c.cols, kEps);
          const std::string vs = what + " vs " + impl_name(impl);
          check_close(y.values(), ref.y, out_rtol(t), 1e-5, "y: " + vs);
          check_close(mean.values(), ref.mean, 1e-5, 1e-5, "mean: " + vs);
          check_close(rstd.values(), ref.rstd, 1e-5, 1e-5, "rstd: " + vs);
        }
      });
    }
  }
}

TEST_CASE("layer_norm_backward matches Loom's CPU kernel and ATen", "[layer_norm]") {
  const LnCase cases[] = {
      {5, 37, 0, "fused, row of 37 (a partial pack)"},
      {13, 1000, 0, "fused, two warps, rows strided over the blocks"},
      {3, 1024, 0, "fused, 16-byte vector path"},
      {4, 64, 1, "fused, misaligned pointers"},
      {3, 8200, 0, "fused, 17 warps, 64 KiB of dynamic shared memory (cudaFuncSetAttribute)"},
      {3, 16400, 0, "unfused (row longer than the fused kernel's cache)"},
  };
  uint32_t seed = 100;
  int rotate = 0;
  for (const LnCase& c : cases) {
    for (DType t : kAllDTypes) {
      const std::vector<float> x = random_values(t, c.rows * c.cols, seed++, 0.5f, 2.0f);
      const std::vector<float> dy = random_values(t, c.rows * c.cols, seed++);
      const std::vector<float> gamma = random_values(DType::kFloat, c.cols, seed++, 1.0f, 0.3f);
      const std::vector<float> beta(c.cols, 0.0f);
      const LayerNormRef fwd =
          layer_norm_ref(RefImpl::kLoomCpu, ref_type(t), x, gamma, beta, c.rows, c.cols, kEps);
      auto run = [&](const std::string& sched) {
        const std::string what = label(t, std::string(c.what) + ", " + sched);
        DeviceArray ddy(t, dy, c.misalign), dx_in(t, x, c.misalign),
            dmean(DType::kFloat, fwd.mean, c.misalign), drstd(DType::kFloat, fwd.rstd, c.misalign),
            dg(DType::kFloat, gamma, c.misalign);
        DeviceArray dx(t, c.rows * c.cols, c.misalign), dgamma(DType::kFloat, c.cols, c.misalign),
            dbeta(DType::kFloat, c.cols, c.misalign);
        DeviceArray ws(DType::kFloat, ops::cuda::layer_norm_backward_workspace(c.rows, c.cols));
        ops::cuda::layer_norm_backward(t, ddy.get(), dx_in.get(), dmean.ptr<float>(),
                                       drstd.ptr<float>(), dg.ptr<float>(), dx.get(),
                                       dgamma.ptr<float>(), dbeta.ptr<float>(), ws.ptr<float>(),
                                       c.rows, c.cols, nullptr);
        for (RefImpl impl : kAllRefs) {
          const LayerNormGradRef ref = layer_norm_backward_ref(impl, ref_type(t), dy, x, gamma,
                                                               fwd.mean, fwd.rstd, c.rows, c.cols);
          const std::string vs = what + " vs " + impl_name(impl);
          check_close(dx.values(), ref.dx, out_rtol(t), 1e-4, "dx: " + vs);
          check_close(dgamma.values(), ref.dgamma, 1e-4, 1e-4, "dgamma: " + vs);
          check_close(dbeta.values(), ref.dbeta, 1e-4, 1e-4, "dbeta: " + vs);
        }
      };
      if (c.cols > 16384)
        run(use_schedule(rotate++));  // ~10^6 threads a launch: one schedule per dtype
      else
        for_each_schedule(run);
    }
  }
  use_schedule(0);
}

TEST_CASE("layer_norm_backward of no rows zeroes the parameter gradients", "[layer_norm]") {
  for (DType t : kAllDTypes) {
    DeviceArray dgamma(DType::kFloat, 24), dbeta(DType::kFloat, 24);  // NaN-filled
    ops::cuda::layer_norm_backward(t, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                   dgamma.ptr<float>(), dbeta.ptr<float>(), nullptr, 0, 24,
                                   nullptr);
    check_close(dgamma.values(), std::vector<float>(24, 0.0f), 0, 0, label(t, "dgamma"));
    check_close(dbeta.values(), std::vector<float>(24, 0.0f), 0, 0, label(t, "dbeta"));
  }
}

}  // namespace
}  // namespace loom::cuda_test
