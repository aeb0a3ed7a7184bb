// Bias + GeLU (tanh approximation, Hendrycks & Gimpel 2016; Megatron's bias_gelu) on CPU:
//   u = x + b,  y = 0.5 u (1 + tanh(k (u + c u^3))),  k = sqrt(2/pi), c = 0.044715
//   dy/du = 0.5 (1 + t) + 0.5 u (1 - t^2) k (1 + 3 c u^2),  t = tanh(k (u + c u^3))
// fp32 runs in vectors of the CPU's ISA (isa.h, simd.h), through the equal sigmoid form below;
// other dtypes through ATen's Vectorized in this library's baseline build.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "internal.h"
#include "isa.h"
#include "kernels.h"
#include "simd.h"

// simd.h's vectors never cross a call (all inlined), so their ABI note does not apply; the
// templates are instantiated at the end of the file, hence not a push/pop region.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace loom::ops {
namespace {

constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;

/// Rows of x [rows, cols] (+ bias) through f(u, g) -> value, vectorised over a row held in
/// the accumulation type; g is the matching row of dy (or u again when dy is null).
template <typename scalar_t, typename F>
void gelu_rows(const scalar_t* x, const scalar_t* dy, const at::opmath_type<scalar_t>* bias,
               scalar_t* out, int64_t rows, int64_t cols, const F& f) {
  using acc_t = at::opmath_type<scalar_t>;
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / cols), [&](int64_t begin, int64_t end) {
    std::vector<acc_t> u(cols), g(cols);
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t j = 0; j < cols; ++j) {
        u[j] = static_cast<acc_t>(x[r * cols + j]) + bias[j];
        g[j] = dy ? static_cast<acc_t>(dy[r * cols + j]) : acc_t(0);
      }
      at::vec::map2<acc_t>(f, u.data(), u.data(), g.data(), cols);
      for (int64_t j = 0; j < cols; ++j) out[r * cols + j] = static_cast<scalar_t>(u[j]);
    }
  });
}

/// 0.5 u (1 + tanh(k (u + c u^3)))
template <typename Vec>
Vec gelu_tanh(Vec u) {
  using acc_t = typename Vec::value_type;
  const Vec t = (Vec(acc_t(kSqrt2OverPi)) * (u + Vec(acc_t(kGeluCubic)) * u * u * u)).tanh();
  return Vec(acc_t(0.5)) * u * (Vec(acc_t(1)) + t);
}

/// d gelu_tanh / du = 0.5 (1 + t) + 0.5 u (1 - t^2) k (1 + 3 c u^2)
template <typename Vec>
Vec gelu_tanh_grad(Vec u) {
  using acc_t = typename Vec::value_type;
  const Vec k{acc_t(kSqrt2OverPi)}, c{acc_t(kGeluCubic)}, half{acc_t(0.5)}, one{acc_t(1)};
  const Vec t = (k * (u + c * u * u * u)).tanh();
  return half * (one + t) + half * u * (one - t * t) * k * (one + Vec(acc_t(3)) * c * u * u);
}

// The fp32 path, in vectors of the ISA that isa() picks (simd.h). With s = 1 / (1 + e^{-2z}),
// z = k (u + c u^3): 0.5 (1 + tanh z) = s, so gelu = u s, and 1 - tanh^2 z = 4 s (1 - s), so
// d gelu / du = s + 2 u s (1 - s) k (1 + 3 c u^2), with 1 - s = e^{-2z} s. Nothing cancels: not
// 1 + tanh for negative u, not 1 - s for positive.
struct F32Rows {
  const float *x, *dy, *bias;  // dy null: forward
  float* out;
  int64_t cols;
};

// One vector of columns from (xs + bs, gs) into ys.
template <typename V>
LOOM_VEC_INLINE void gelu_lanes(const float* xs, const float* bs, const float* gs, float* ys) {
  const V one = cpu::splat<V>(1.0f), k = cpu::splat<V>(static_cast<float>(kSqrt2OverPi));
  const V c = cpu::splat<V>(static_cast<float>(kGeluCubic));
  const V u = cpu::load<V>(xs) + cpu::load<V>(bs);
  const V e = cpu::exp(cpu::splat<V>(-2.0f) * k * (u + c * u * u * u));
  const V s = one / (one + e);
  if (!gs) {
    cpu::store(ys, u * s);
  } else {
    // 1 - s as e s: no cancellation where s is near 1 (large u)
    const V grad = s + cpu::splat<V>(2.0f) * k * u * s * (e * s) * (one + cpu::splat<V>(3.0f) * c * u * u);
    cpu::store(ys, cpu::load<V>(gs) * grad);
  }
}

template <typename V>
LOOM_VEC_INLINE void gelu_f32_body(const F32Rows& a, int64_t begin, int64_t end) {
  constexpr int64_t W = cpu::lanes<V>;
  const int64_t whole = a.cols / W * W, rest = a.cols - whole;
  for (int64_t r = begin; r < end; ++r) {
    const float* x = a.x + r * a.cols;
    const float* dy = a.dy ? a.dy + r * a.cols : nullptr;
    float* y = a.out + r * a.cols;
    for (int64_t j = 0; j < whole; j += W) gelu_lanes<V>(x + j, a.bias + j, dy ? dy + j : nullptr, y + j);
    if (rest > 0) {  // the row's tail through zero-padded copies
      float x_tail[W] = {}, b_tail[W] = {}, g_tail[W] = {}, y_tail[W];
      std::copy(x + whole, x + a.cols, x_tail);
      std::copy(a.bias + whole, a.bias + a.cols, b_tail);
      if (dy) std::copy(dy + whole, dy + a.cols, g_tail);
      gelu_lanes<V>(x_tail, b_tail, dy ? g_tail : nullptr, y_tail);
      std::copy(y_tail, y_tail + rest, y + whole);
    }
  }
}

LOOM_TARGET_AVX512 void gelu_f32_avx512(const F32Rows& a, int64_t begin, int64_t end) { gelu_f32_body<cpu::Vec<16>>(a, begin, end); }
LOOM_TARGET_AVX2 void gelu_f32_avx2(const F32Rows& a, int64_t begin, int64_t end) { gelu_f32_body<cpu::Vec<8>>(a, begin, end); }
void gelu_f32_baseline(const F32Rows& a, int64_t begin, int64_t end) { gelu_f32_body<cpu::Vec<4>>(a, begin, end); }

/// The fp32 rows of x (+ bias) through gelu (dy null) or dy * gelu'.
void gelu_f32_rows(const float* x, const float* dy, const float* bias, float* out, int64_t rows, int64_t cols) {
  const F32Rows args{x, dy, bias, out, cols};
  const auto run = cpu::pick_isa(&gelu_f32_avx512, &gelu_f32_avx2, &gelu_f32_baseline);
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / cols), [&](int64_t begin, int64_t end) { run(args, begin, end); });
}

}  // namespace

at::Tensor bias_gelu_cpu(const at::Tensor& x_in, const at::Tensor& bias) {
  internal::check_bias_gelu(x_in, bias);
  const at::Tensor x = x_in.contiguous();
  const at::Tensor b = internal::as_acc_param(bias, x.scalar_type());
  at::Tensor y = at::empty_like(x);
  const int64_t cols = x.size(-1);
  if (x.numel() == 0) return y;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "loom_bias_gelu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    using Vec = at::vec::Vectorized<acc_t>;
    if constexpr (std::is_same_v<scalar_t, float>) {
      gelu_f32_rows(x.const_data_ptr<float>(), nullptr, b.const_data_ptr<float>(), y.mutable_data_ptr<float>(),
                    x.numel() / cols, cols);
      return;
    }
    gelu_rows<scalar_t>(x.const_data_ptr<scalar_t>(), nullptr, b.const_data_ptr<acc_t>(),
                        y.mutable_data_ptr<scalar_t>(), x.numel() / cols, cols,
                        [](Vec u, Vec) { return gelu_tanh(u); });
  });
  return y;
}

at::Tensor bias_gelu_backward_cpu(const at::Tensor& dy_in, const at::Tensor& x_in,
                                  const at::Tensor& bias) {
  internal::check_bias_gelu(x_in, bias);
  TORCH_CHECK(dy_in.sizes() == x_in.sizes() && dy_in.scalar_type() == x_in.scalar_type(),
              "loom::bias_gelu_backward: grad_out must match the input (", x_in.sizes(), ", ",
              x_in.scalar_type(), "), got ", dy_in.sizes(), ", ", dy_in.scalar_type());
  const at::Tensor x = x_in.contiguous(), dy = dy_in.contiguous();
  const at::Tensor b = internal::as_acc_param(bias, x.scalar_type());
  at::Tensor dx = at::empty_like(x);
  const int64_t cols = x.size(-1);
  if (x.numel() == 0) return dx;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "loom_bias_gelu_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    using Vec = at::vec::Vectorized<acc_t>;
    if constexpr (std::is_same_v<scalar_t, float>) {
      gelu_f32_rows(x.const_data_ptr<float>(), dy.const_data_ptr<float>(), b.const_data_ptr<float>(),
                    dx.mutable_data_ptr<float>(), x.numel() / cols, cols);
      return;
    }
    gelu_rows<scalar_t>(x.const_data_ptr<scalar_t>(), dy.const_data_ptr<scalar_t>(),
                        b.const_data_ptr<acc_t>(), dx.mutable_data_ptr<scalar_t>(),
                        x.numel() / cols, cols,
                        [](Vec u, Vec g) { return g * gelu_tanh_grad(u); });
  });
  return dx;
}

}  // namespace loom::ops
