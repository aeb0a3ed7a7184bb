// SwiGLU on CPU over Loom's interleaved fc1 output: element i of the output reads the pair
// (g, u) = (x[2i], x[2i + 1]) (csrc/model/mlp.h), in the accumulation type:
//   y = silu(g) u = g σ(g) u
//   dg = dy u σ(g) (1 + g (1 − σ(g))),  du = dy g σ(g)
// Vectorised with ATen Vectorized: a block of pairs is loaded as two vectors (converted to fp32
// for bf16/fp16), split into gates and ups with deinterleave2 and, in the backward, joined with
// interleave2; the few pairs past the last whole block run the scalar formulas.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <cmath>
#include <type_traits>
#include <utility>

#include "internal.h"
#include "kernels.h"

namespace loom::ops {
namespace {

template <typename T>
T sigmoid_of(T g) {
  return T(1) / (T(1) + g.neg().exp());
}
template <>
float sigmoid_of(float g) { return 1.0f / (1.0f + std::exp(-g)); }
template <>
double sigmoid_of(double g) { return 1.0 / (1.0 + std::exp(-g)); }

/// (dg, du) of one pair or one vector of pairs.
template <typename T>
std::pair<T, T> swiglu_grads(T g, T u, T d) {
  const T sg = sigmoid_of(g);
  return {d * u * sg * (T(1) + g * (T(1) - sg)), d * g * sg};
}

/// Pairs [begin, end) of the forward (dy null) or backward, with V = Vectorized<acc_t>::size():
/// fp32/fp64 take V pairs a step (two vector loads), bf16/fp16 take 2V (two reduced-precision
/// vector loads, each converted to two fp32 vectors).
template <typename scalar_t>
void swiglu_range(const scalar_t* x, const scalar_t* dy, scalar_t* out, int64_t begin, int64_t end) {
  using acc_t = at::opmath_type<scalar_t>;
  using Vec = at::vec::Vectorized<acc_t>;
  using SVec = at::vec::Vectorized<scalar_t>;
  constexpr bool kReduced = !std::is_same_v<scalar_t, acc_t>;
  constexpr int64_t V = Vec::size();
  constexpr int64_t kStep = kReduced ? 2 * V : V;  // pairs a step
  // Loads the 2 kStep elements of pairs [i, i + kStep) as kStep / V pairs of fp32 vectors.
  auto load_pairs = [&](int64_t i, Vec* g, Vec* u) {
    if constexpr (kReduced) {
      for (int k = 0; k < 2; ++k) {
        auto [a, b] = at::vec::convert_to_float<scalar_t>(SVec::loadu(x + 2 * i + k * 2 * V));
        std::tie(g[k], u[k]) = at::vec::deinterleave2(a, b);
      }
    } else {
      std::tie(g[0], u[0]) = at::vec::deinterleave2(Vec::loadu(x + 2 * i), Vec::loadu(x + 2 * i + V));
    }
  };
  int64_t i = begin;
  for (; i + kStep <= end; i += kStep) {
    Vec g[2], u[2];
    load_pairs(i, g, u);
    constexpr int kVecs = kReduced ? 2 : 1;
    if (!dy) {
      Vec y[2];
      for (int k = 0; k < kVecs; ++k) y[k] = g[k] * sigmoid_of(g[k]) * u[k];
      if constexpr (kReduced)
        at::vec::convert_from_float<scalar_t>(y[0], y[1]).store(out + i);
      else
        y[0].store(out + i);
      continue;
    }
    Vec d[2];
    if constexpr (kReduced)
      std::tie(d[0], d[1]) = at::vec::convert_to_float<scalar_t>(SVec::loadu(dy + i));
    else
      d[0] = Vec::loadu(dy + i);
    for (int k = 0; k < kVecs; ++k) {
      auto [dg, du] = swiglu_grads(g[k], u[k], d[k]);
      auto [lo, hi] = at::vec::interleave2(dg, du);  // pairs (dg, du) of this vector's V pairs
      if constexpr (kReduced)
        at::vec::convert_from_float<scalar_t>(lo, hi).store(out + 2 * (i + k * V));
      else {
        lo.store(out + 2 * i);
        hi.store(out + 2 * i + V);
      }
    }
  }
  for (; i < end; ++i) {  // the tail
    const acc_t g = static_cast<acc_t>(x[2 * i]), u = static_cast<acc_t>(x[2 * i + 1]);
    if (!dy) {
      out[i] = static_cast<scalar_t>(g * sigmoid_of(g) * u);
      continue;
    }
    auto [dg, du] = swiglu_grads(g, u, static_cast<acc_t>(dy[i]));
    out[2 * i] = static_cast<scalar_t>(dg);
    out[2 * i + 1] = static_cast<scalar_t>(du);
  }
}

void swiglu_pairs(const at::Tensor& x, const at::Tensor* dy, at::Tensor& out, int64_t pairs) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "loom_swiglu", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* dp = dy ? dy->const_data_ptr<scalar_t>() : nullptr;
    scalar_t* op = out.mutable_data_ptr<scalar_t>();
    // Chunks of whole steps (a multiple of 64 pairs), so that only the last chunk has a tail.
    at::parallel_for(0, (pairs + 63) / 64, 64, [&](int64_t b, int64_t e) {
      swiglu_range<scalar_t>(xp, dp, op, b * 64, std::min(pairs, e * 64));
    });
  });
}

}  // namespace

at::Tensor swiglu_cpu(const at::Tensor& x_in) {
  internal::check_swiglu(x_in);
  const at::Tensor x = x_in.contiguous();
  at::Tensor y = at::empty(internal::with_last_dim(x, x.size(-1) / 2), x.options());
  if (y.numel() > 0) swiglu_pairs(x, nullptr, y, y.numel());
  return y;
}

at::Tensor swiglu_backward_cpu(const at::Tensor& dy_in, const at::Tensor& x_in) {
  internal::check_swiglu_backward(dy_in, x_in);
  const at::Tensor x = x_in.contiguous(), dy = dy_in.contiguous();
  at::Tensor dx = at::empty_like(x);
  if (dx.numel() > 0) swiglu_pairs(x, &dy, dx, dy.numel());
  return dx;
}

}  // namespace loom::ops
