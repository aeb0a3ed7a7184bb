#include "model/rotary.h"

#include <ATen/ATen.h>

#include <cmath>
#include <stdexcept>

#include "loom_ops/ops.h"

namespace loom::model {

namespace {

// Llama 3.1's frequency rule (rotary.h), in float32 and in the order transformers and
// Megatron-Core compute it, so that fp32 logits agree to the last bits.
at::Tensor llama3_scaled(const at::Tensor& inv_freq, const RopeScaling& r) {
  const double old_len = static_cast<double>(r.old_context_len);
  const double low_wavelength = old_len / r.low_freq_factor, high_wavelength = old_len / r.high_freq_factor;
  // scalar / tensor in torch is tensor.reciprocal() * scalar (Tensor.__rtruediv__): the same here.
  const at::Tensor wavelength = inv_freq.reciprocal() * (2.0 * M_PI);
  const at::Tensor long_scaled = at::where(wavelength > low_wavelength, inv_freq / r.factor, inv_freq);
  const at::Tensor smooth =
      (wavelength.reciprocal() * old_len - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  const at::Tensor smoothed = (1.0 - smooth) * long_scaled / r.factor + smooth * long_scaled;
  const at::Tensor medium = (wavelength >= high_wavelength).logical_and(wavelength <= low_wavelength);
  return at::where(medium, smoothed, long_scaled);
}

}  // namespace

at::Tensor rotary_inverse_frequencies(const ModelShape& shape, at::Device device) {
  const int64_t r = shape.rotary_dim();
  if (r < 2 || r % 2 != 0)
    throw std::invalid_argument("rotary_tables: rope needs an even head dimension (rotated dimensions), found " +
                                std::to_string(r));
  const auto long_options = at::TensorOptions().dtype(at::kLong).device(device);
  at::Tensor exponent = at::arange(0, r, 2, long_options).to(at::kFloat) / static_cast<double>(r);
  at::Tensor inv_freq = at::pow(at::Scalar(shape.rotary_base), exponent).reciprocal();  // [r/2]
  return shape.rope_scaling.enabled ? llama3_scaled(inv_freq, shape.rope_scaling) : inv_freq;
}

RotaryTables rotary_tables(const at::Tensor& position_ids, const ModelShape& shape, at::ScalarType dtype) {
  if (position_ids.dim() != 2)
    throw std::invalid_argument("rotary_tables: expected position_ids [b, s], found " + c10::str(position_ids.sizes()));
  const at::Tensor inv_freq = rotary_inverse_frequencies(shape, position_ids.device());
  at::Tensor angles = position_ids.to(at::kFloat).unsqueeze(-1) * inv_freq;  // [b, s, r/2]
  at::Tensor both = at::cat({angles, angles}, -1).unsqueeze(1);                // [b, 1, s, r]
  return {both.cos().to(dtype), both.sin().to(dtype)};
}

RotaryTables rotary_tables(const at::Tensor& position_ids, int64_t head_dim, double base, at::ScalarType dtype) {
  ModelShape plain;
  plain.hidden_size = head_dim;
  plain.num_attention_heads = 1;
  plain.rotary_base = base;
  return rotary_tables(position_ids, plain, dtype);
}

at::Tensor apply_rotary(const at::Tensor& x, const RotaryTables& tables, bool fused) {
  if (fused) return ops::rotary(x, tables.cos, tables.sin);
  const int64_t r = tables.cos.size(-1), half = r / 2;
  const at::Tensor x_r = r == x.size(-1) ? x : x.narrow(-1, 0, r);
  at::Tensor rotated = at::cat({x_r.narrow(-1, half, half).neg(), x_r.narrow(-1, 0, half)}, -1);
  at::Tensor out = x_r * tables.cos + rotated * tables.sin;
  return r == x.size(-1) ? out : at::cat({out, x.narrow(-1, r, x.size(-1) - r)}, -1);
}

}  // namespace loom::model
