// Rotary position embedding (rotate-half pairing) on CPU: rows (b, head, s) in parallel, each
// read through the input's strides (Q and K are views of the fused QKV projection, so no copy
// is made first) and written to a contiguous output. With c, s the table values at i and
// i + r/2, i < r/2:
//   forward:  o₁ = x₁ c[i] − x₂ s[i],  o₂ = x₂ c[i + r/2] + x₁ s[i + r/2]
//   backward: the transpose, o₁ = x₁ c[i] + x₂ s[i + r/2],  o₂ = x₂ c[i + r/2] − x₁ s[i]
// (for Loom's tables, whose halves are equal, the rotation by −θ). Dimensions r.. d are copied.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include "internal.h"
#include "kernels.h"

namespace loom::ops {
namespace {

template <typename scalar_t>
void rotary_rows(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& out,
                 bool backward) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t B = x.size(0), H = x.size(1), S = x.size(2), d = x.size(3);
  const int64_t r = cos.size(3), half = r / 2;
  const int64_t sb = x.stride(0), sh = x.stride(1), ss = x.stride(2);
  const int64_t table_batch_stride = cos.size(0) == 1 ? 0 : S * r;
  const scalar_t* xp = x.const_data_ptr<scalar_t>();
  const scalar_t* cp = cos.const_data_ptr<scalar_t>();
  const scalar_t* sp = sin.const_data_ptr<scalar_t>();
  scalar_t* op = out.mutable_data_ptr<scalar_t>();
  const acc_t sign = backward ? acc_t(-1) : acc_t(1);
  at::parallel_for(0, B * H * S, std::max<int64_t>(1, 16384 / std::max<int64_t>(d, 1)),
                   [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / (H * S), h = (row / S) % H, s = row % S;
      const scalar_t* xr = xp + b * sb + h * sh + s * ss;
      const scalar_t* c = cp + b * table_batch_stride + s * r;
      const scalar_t* sn = sp + b * table_batch_stride + s * r;
      // forward: s[i] multiplies x₂ and s[i + r/2] multiplies x₁; backward swaps them and the
      // sign (chosen per row, so that the loop below is branch-free and vectorises).
      const scalar_t* s_x2 = backward ? sn + half : sn;
      const scalar_t* s_x1 = backward ? sn : sn + half;
      scalar_t* o = op + row * d;
      for (int64_t i = 0; i < half; ++i) {
        const acc_t x1 = static_cast<acc_t>(xr[i]), x2 = static_cast<acc_t>(xr[i + half]);
        o[i] = static_cast<scalar_t>(x1 * static_cast<acc_t>(c[i]) - sign * x2 * static_cast<acc_t>(s_x2[i]));
        o[i + half] =
            static_cast<scalar_t>(x2 * static_cast<acc_t>(c[i + half]) + sign * x1 * static_cast<acc_t>(s_x1[i]));
      }
      for (int64_t j = r; j < d; ++j) o[j] = xr[j];
    }
  });
}

at::Tensor rotary_apply_cpu(const char* op, const char* arg, const at::Tensor& x_in,
                            const at::Tensor& cos_in, const at::Tensor& sin_in, bool backward) {
  internal::check_rotary(op, arg, x_in, cos_in, sin_in);
  const at::Tensor x = x_in.stride(3) == 1 ? x_in : x_in.contiguous();
  const at::Tensor cos = cos_in.contiguous(), sin = sin_in.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "loom_rotary", [&] {
    rotary_rows<scalar_t>(x, cos, sin, out, backward);
  });
  return out;
}

}  // namespace

at::Tensor rotary_cpu(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return rotary_apply_cpu("rotary", "input", x, cos, sin, /*backward=*/false);
}

at::Tensor rotary_backward_cpu(const at::Tensor& dy, const at::Tensor& cos, const at::Tensor& sin) {
  return rotary_apply_cpu("rotary_backward", "grad_out", dy, cos, sin, /*backward=*/true);
}

}  // namespace loom::ops
