// Scaled masked softmax on CPU over rows of x viewed as [rows, sk] (sq = x.size(-2)).
// Row r is query i = r % sq; causal masks key j > i + (sk - sq) (the last query sees every
// key, as in Megatron's upper-triangular softmax when sq == sk). Masked entries get
// probability 0; a fully masked row is all zeros. Backward: dx = scale y (dy - <dy, y>).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <cmath>
#include <limits>
#include <vector>

#include "internal.h"
#include "kernels.h"

namespace loom::ops {
namespace {

template <typename scalar_t>
void softmax_rows(const scalar_t* x, const bool* mask, const int64_t* mask_rows, scalar_t* y,
                  int64_t rows, int64_t sq, int64_t sk, double scale_d, bool causal) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t scale = static_cast<acc_t>(scale_d);
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(sk, 1)),
                   [&](int64_t begin, int64_t end) {
    std::vector<acc_t> buf(sk);
    for (int64_t r = begin; r < end; ++r) {
      const scalar_t* xr = x + r * sk;
      const bool* mr = mask ? mask + mask_rows[r] : nullptr;
      const int64_t limit = causal ? std::min<int64_t>(sk, r % sq + (sk - sq) + 1) : sk;
      acc_t mx = -std::numeric_limits<acc_t>::infinity();
      for (int64_t j = 0; j < sk; ++j) {
        const bool masked = j >= limit || (mr && mr[j]);
        buf[j] = masked ? -std::numeric_limits<acc_t>::infinity()
                        : static_cast<acc_t>(xr[j]) * scale;
        mx = std::max(mx, buf[j]);
      }
      scalar_t* yr = y + r * sk;
      if (mx == -std::numeric_limits<acc_t>::infinity()) {  // fully masked row
        for (int64_t j = 0; j < sk; ++j) yr[j] = scalar_t(0);
        continue;
      }
      acc_t sum = 0;
      for (int64_t j = 0; j < sk; ++j) {
        buf[j] = std::exp(buf[j] - mx);  // exp(-inf) = 0 for masked entries
        sum += buf[j];
      }
      const acc_t inv = acc_t(1) / sum;
      for (int64_t j = 0; j < sk; ++j) yr[j] = static_cast<scalar_t>(buf[j] * inv);
    }
  });
}

template <typename scalar_t>
void softmax_backward_rows(const scalar_t* dy, const scalar_t* y, scalar_t* dx, int64_t rows,
                           int64_t sk, double scale_d) {
  using acc_t = at::opmath_type<scalar_t>;
  using Vec = at::vec::Vectorized<acc_t>;
  const acc_t scale = static_cast<acc_t>(scale_d);
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(sk, 1)),
                   [&](int64_t begin, int64_t end) {
    std::vector<acc_t> g(sk), p(sk);
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t j = 0; j < sk; ++j) {
        g[j] = static_cast<acc_t>(dy[r * sk + j]);
        p[j] = static_cast<acc_t>(y[r * sk + j]);
      }
      const acc_t dot = at::vec::map2_reduce_all<acc_t>(
          [](Vec a, Vec b) { return a * b; }, [](Vec a, Vec b) { return a + b; }, g.data(),
          p.data(), sk);
      at::vec::map2<acc_t>([=](Vec gv, Vec pv) { return Vec(scale) * pv * (gv - Vec(dot)); },
                           g.data(), g.data(), p.data(), sk);
      for (int64_t j = 0; j < sk; ++j) dx[r * sk + j] = static_cast<scalar_t>(g[j]);
    }
  });
}

}  // namespace

at::Tensor scaled_masked_softmax_cpu(const at::Tensor& x_in,
                                     const std::optional<at::Tensor>& mask, double scale,
                                     bool causal) {
  internal::check_softmax(x_in, mask);
  const at::Tensor x = x_in.contiguous();
  at::Tensor y = at::empty_like(x);
  if (x.numel() == 0) return y;
  const int64_t sk = x.size(-1), sq = x.size(-2), rows = x.numel() / sk;
  internal::MaskRows m;
  if (mask) m = internal::prepare_mask(*mask, x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "loom_softmax", [&] {
    softmax_rows<scalar_t>(x.const_data_ptr<scalar_t>(),
                           mask ? m.data.const_data_ptr<bool>() : nullptr,
                           mask ? m.row_offsets.const_data_ptr<int64_t>() : nullptr,
                           y.mutable_data_ptr<scalar_t>(), rows, sq, sk, scale, causal);
  });
  return y;
}

at::Tensor scaled_masked_softmax_backward_cpu(const at::Tensor& dy_in, const at::Tensor& y_in,
                                              double scale) {
  internal::check_softmax_backward(dy_in, y_in);
  const at::Tensor dy = dy_in.contiguous(), y = y_in.contiguous();
  at::Tensor dx = at::empty_like(y);
  if (y.numel() == 0) return dx;
  const int64_t sk = y.size(-1), rows = y.numel() / sk;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, y.scalar_type(), "loom_softmax_backward", [&] {
    softmax_backward_rows<scalar_t>(dy.const_data_ptr<scalar_t>(), y.const_data_ptr<scalar_t>(),
                                    dx.mutable_data_ptr<scalar_t>(), rows, sk, scale);
  });
  return dx;
}

}  // namespace loom::ops
