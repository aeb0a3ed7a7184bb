#include "model/rotary.h"

#include <ATen/ATen.h>

#include <stdexcept>

namespace loom::model {

RotaryTables rotary_tables(const at::Tensor& position_ids, int64_t head_dim, double base, at::ScalarType dtype) {
  if (head_dim < 2 || head_dim % 2 != 0)
    throw std::invalid_argument("rotary_tables: rope needs an even head dimension, found " + std::to_string(head_dim));
  if (position_ids.dim() != 2)
    throw std::invalid_argument("rotary_tables: expected position_ids [b, s], found " + c10::str(position_ids.sizes()));
  const auto float_options = at::TensorOptions().dtype(at::kFloat).device(position_ids.device());
  // θ^(-2i/d) as base ** (2i / d) in float32, then its reciprocal: the same rounding as the
  // reference implementations, so fp32 logits agree to the last bits.
  at::Tensor exponent = at::arange(0, head_dim, 2, float_options.dtype(at::kLong)).to(at::kFloat) / static_cast<double>(head_dim);
  at::Tensor inv_freq = at::pow(at::Scalar(base), exponent).reciprocal();  // [d/2]
  at::Tensor angles = position_ids.to(at::kFloat).unsqueeze(-1) * inv_freq;           // [b, s, d/2]
  at::Tensor both = at::cat({angles, angles}, -1).unsqueeze(1);                         // [b, 1, s, d]
  return {both.cos().to(dtype), both.sin().to(dtype)};
}

at::Tensor apply_rotary(const at::Tensor& x, const RotaryTables& tables) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor rotated = at::cat({x.narrow(-1, half, half).neg(), x.narrow(-1, 0, half)}, -1);
  return x * tables.cos + rotated * tables.sin;
}

}  // namespace loom::model
