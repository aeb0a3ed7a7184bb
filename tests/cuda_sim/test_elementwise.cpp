// Elementwise CUDA kernels (extensions/src/cuda/elementwise.cu) through their raw launchers:
// bias+GeLU against Loom's CPU kernel and ATen; dropout and its mask against Loom's CPU
// kernel and the scalar Philox definition (philox.h), bit for bit, for shards at offsets.
#include "kernel_test_util.h"
#include "loom_ops/dropout_layout.h"
#include "loom_ops/philox.h"

namespace loom::cuda_test {
namespace {

double out_rtol(DType t) { return t == DType::kFloat ? 1e-5 : 2 * dtype_eps(t); }

TEST_CASE("bias_gelu forward and backward match Loom's CPU kernel and ATen", "[gelu]") {
  struct Case {
    int64_t rows, cols;
    size_t misalign;
    const char* what;
  };
  const Case cases[] = {
      {5, 37, 0, "row of 37 (a partial pack)"},
      {3, 64, 0, "vector path"},
      {4, 64, 1, "misaligned pointers"},
      {2, 2056, 0, "two blocks per row"},
  };
  uint32_t seed = 300;
  for (const Case& c : cases) {
    for (DType t : kAllDTypes) {
      const int64_t n = c.rows * c.cols;
      const std::vector<float> x = random_values(t, n, seed++, 0.0f, 2.0f);
      const std::vector<float> dy = random_values(t, n, seed++);
      const std::vector<float> bias = random_values(DType::kFloat, c.cols, seed++, 0.0f, 0.5f);
      for_each_schedule([&](const std::string& sched) {
        const std::string what = label(t, std::string(c.what) + ", " + sched);
        DeviceArray dx(t, x, c.misalign), ddy(t, dy, c.misalign),
            db(DType::kFloat, bias, c.misalign), y(t, n, c.misalign), g(t, n, c.misalign);
        ops::cuda::bias_gelu_forward(t, dx.get(), db.ptr<float>(), y.get(), c.rows, c.cols,
                                     nullptr);
        ops::cuda::bias_gelu_backward(t, ddy.get(), dx.get(), db.ptr<float>(), g.get(), c.rows,
                                      c.cols, nullptr);
        for (RefImpl impl : kAllRefs) {
          const std::string vs = what + " vs " + impl_name(impl);
          check_close(y.values(), bias_gelu_ref(impl, ref_type(t), {}, x, bias, c.rows, c.cols),
                      out_rtol(t), 1e-5, "y: " + vs);
          check_close(g.values(), bias_gelu_ref(impl, ref_type(t), dy, x, bias, c.rows, c.cols),
                      out_rtol(t), 1e-5, "dx: " + vs);
        }
      });
    }
  }
}

struct DropoutCase {
  std::vector<int64_t> local, global, offset;
  size_t misalign;
  bool bias, residual;
  double p;
  const char* what;
};

const DropoutCase kDropoutCases[] = {
    {{3, 5, 37}, {6, 5, 40}, {2, 0, 3}, 0, false, false, 0.3,
     "dropout of a shard at an offset (row starts not multiples of 4)"},
    {{3, 5, 37}, {6, 5, 40}, {2, 0, 3}, 0, true, true, 0.3, "bias_dropout_add of a shard"},
    {{4, 64}, {}, {}, 0, true, true, 0.1, "vector path"},
    {{4, 64}, {8, 64}, {4, 0}, 1, false, true, 0.5, "misaligned, residual without bias"},
    {{2, 40}, {}, {}, 0, true, true, 0.0, "p = 0 keeps everything"},
    {{2, 40}, {}, {}, 0, false, true, 1.0, "p = 1 drops everything"},
    {{2, 2056}, {3, 2056}, {1, 0}, 0, true, true, 0.2, "two blocks per row"},
};

/// Keep bit of every local element from the scalar definition (philox.h), with the global
/// index computed here from the multi-index (not through ElementLayout).
std::vector<uint8_t> expected_mask(const DropoutCase& c, uint64_t seed, uint64_t stream) {
  const std::vector<int64_t> global = c.global.empty() ? c.local : c.global;
  const std::vector<int64_t> offset =
      c.offset.empty() ? std::vector<int64_t>(c.local.size(), 0) : c.offset;
  int64_t n = 1;
  for (int64_t s : c.local) n *= s;
  std::vector<uint8_t> keep(n);
  const uint64_t threshold = ops::dropout_keep_threshold(c.p);
  for (int64_t i = 0; i < n; ++i) {
    int64_t rest = i, g = 0, stride = 1;
    for (int d = static_cast<int>(c.local.size()) - 1; d >= 0; --d) {
      g += (offset[d] + rest % c.local[d]) * stride;
      rest /= c.local[d];
      stride *= global[d];
    }
    keep[i] = ops::dropout_keep(seed, stream, static_cast<uint64_t>(g), threshold) ? 1 : 0;
  }
  return keep;
}

TEST_CASE("dropout_mask is bit-identical to the CPU Philox layout at offset shards", "[dropout]") {
  const uint64_t seed = 0x1234567890abcdefull, stream = ops::dropout_stream(7, 3, 2);
  for (const DropoutCase& c : kDropoutCases) {
    const std::vector<uint8_t> want = expected_mask(c, seed, stream);
    CHECK(loom_cpu_dropout_mask(c.local, c.global, c.offset, c.p, seed, stream) == want);
    const ops::ElementLayout layout = ops::make_element_layout(c.local, c.global, c.offset);
    for_each_schedule([&](const std::string& sched) {
      DeviceBuffer out(want.size(), c.misalign);
      out.poison();
      ops::cuda::dropout_mask(static_cast<bool*>(out.get()), layout, seed, stream,
                              ops::dropout_keep_threshold(c.p), nullptr);
      std::vector<uint8_t> got(want.size());
      out.download(got.data());
      INFO(c.what << ", " << sched);
      CHECK(got == want);
    });
  }
}

TEST_CASE("dropout_forward matches Loom's CPU kernel and the Philox mask", "[dropout]") {
  const uint64_t seed = 42, stream = ops::dropout_stream(11, 0, 3);
  uint32_t vseed = 500;
  for (const DropoutCase& c : kDropoutCases) {
    const std::vector<uint8_t> keep = expected_mask(c, seed, stream);
    const ops::ElementLayout layout = ops::make_element_layout(c.local, c.global, c.offset);
    const int64_t n = static_cast<int64_t>(keep.size()), cols = c.local.back();
    const float scale = ops::dropout_scale(c.p);
    for (DType t : kAllDTypes) {
      const std::vector<float> x = random_values(t, n, vseed++);
      const std::vector<float> residual =
          c.residual ? random_values(t, n, vseed++) : std::vector<float>{};
      const std::vector<float> bias =
          c.bias ? random_values(DType::kFloat, cols, vseed++) : std::vector<float>{};
      std::vector<float> want(n);  // the kernel's fp32 arithmetic, rounded once
      for (int64_t i = 0; i < n; ++i) {
        float u = c.bias ? x[i] + bias[i % cols] : x[i];
        u = keep[i] ? u * scale : 0.0f;
        want[i] = round_to(t, c.residual ? u + residual[i] : u);
      }
      const std::vector<float> cpu =
          loom_cpu_dropout(ref_type(t), x, bias, residual, c.local, c.global, c.offset, c.p, seed,
                           stream);
      for_each_schedule([&](const std::string& sched) {
        const std::string what = label(t, std::string(c.what) + ", " + sched);
        DeviceArray dx(t, x, c.misalign), out(t, n, c.misalign);
        DeviceArray dres(t, c.residual ? residual : std::vector<float>{}, c.misalign);
        DeviceArray dbias(DType::kFloat, bias, c.misalign);
        ops::cuda::dropout_forward(t, dx.get(), c.bias ? dbias.ptr<float>() : nullptr,
                                   c.residual ? dres.get() : nullptr, out.get(), layout, seed,
                                   stream, ops::dropout_keep_threshold(c.p), scale, nullptr);
        const std::vector<float> got = out.values();
        check_close(got, want, out_rtol(t), 1e-6, "out: " + what + " vs the Philox mask");
        check_close(got, cpu, out_rtol(t), 1e-6, "out: " + what + " vs Loom CPU");
      });
    }
  }
}

}  // namespace
}  // namespace loom::cuda_test

namespace loom::cuda_test {
namespace {

TEST_CASE("dropout_forward strides over rows past grid.y's limit of 65535", "[dropout]") {
  // 65537 rows of 8: grid (1, 65535), so blocks 0 and 1 also handle rows 65535 and 65536.
  const DropoutCase c{{65537, 8}, {65540, 8}, {2, 0}, 0, false, true, 0.4, "65537 rows"};
  const uint64_t seed = 9, stream = 5;
  const std::vector<uint8_t> keep = expected_mask(c, seed, stream);
  const int64_t n = static_cast<int64_t>(keep.size());
  const DType t = DType::kFloat;
  const std::vector<float> x = random_values(t, n, 900), residual = random_values(t, n, 901);
  const float scale = ops::dropout_scale(c.p);
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = (keep[i] ? x[i] * scale : 0.0f) + residual[i];
  DeviceArray dx(t, x), dres(t, residual), out(t, n);
  ops::cuda::dropout_forward(t, dx.get(), nullptr, dres.get(), out.get(),
                             ops::make_element_layout(c.local, c.global, c.offset), seed, stream,
                             ops::dropout_keep_threshold(c.p), scale, nullptr);
  check_close(out.values(), want, 1e-6, 1e-6, "out (one schedule: 2 million threads)");
}

}  // namespace
}  // namespace loom::cuda_test
