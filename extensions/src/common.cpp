#include "internal.h"

#include <ATen/ATen.h>

#include <initializer_list>
#include <sstream>
#include <utility>
#include <stdexcept>

namespace loom::ops::internal {

at::ScalarType acc_dtype(at::ScalarType input) {
  return input == at::kDouble ? at::kDouble : at::kFloat;
}

at::Tensor as_acc_param(const at::Tensor& param, at::ScalarType input) {
  return param.to(acc_dtype(input)).contiguous();
}

void check_floating(const char* op, const char* arg, const at::Tensor& t) {
  const auto d = t.scalar_type();
  TORCH_CHECK(d == at::kFloat || d == at::kDouble || d == at::kBFloat16 || d == at::kHalf,
              "loom::", op, ": ", arg, " must be float32, float64, bfloat16 or float16, got ",
              d);
}

void check_same_device(const char* op, const at::Tensor& a, const char* arg,
                       const at::Tensor& b) {
  TORCH_CHECK(a.device() == b.device(), "loom::", op, ": ", arg, " is on ", b.device(),
              " but the input is on ", a.device());
}

void check_param(const char* op, const char* arg, const at::Tensor& param,
                 const at::Tensor& input) {
  TORCH_CHECK(input.dim() >= 1, "loom::", op, ": input must have at least one dimension");
  const int64_t h = input.size(-1);
  TORCH_CHECK(param.dim() == 1 && param.size(0) == h, "loom::", op, ": ", arg,
              " must have shape [", h, "] (the last dimension of the input), got ",
              param.sizes());
  TORCH_CHECK(param.scalar_type() == input.scalar_type() || param.scalar_type() == at::kFloat,
              "loom::", op, ": ", arg, " must be ", input.scalar_type(),
              " (the input's dtype) or float32, got ", param.scalar_type());
  check_same_device(op, input, arg, param);
}

void check_probability(const char* op, double p) {
  TORCH_CHECK(p >= 0.0 && p <= 1.0, "loom::", op,
              ": dropout probability must be in [0, 1], got ", p);
}

void check_layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  check_floating("layer_norm", "input", x);
  check_param("layer_norm", "weight", weight, x);
  check_param("layer_norm", "bias", bias, x);
}

namespace {

/// The checks every normalisation backward shares: input, grad_out, weight and the per-row
/// statistics `stats` (named `stat_names` in the message).
void check_norm_backward(const char* op, const at::Tensor& dy, const at::Tensor& x,
                         const at::Tensor& weight, std::initializer_list<const at::Tensor*> stats,
                         const char* stat_names) {
  check_floating(op, "input", x);
  TORCH_CHECK(dy.sizes() == x.sizes() && dy.scalar_type() == x.scalar_type(), "loom::", op,
              ": grad_out must match the input (", x.sizes(), ", ", x.scalar_type(), "), got ",
              dy.sizes(), ", ", dy.scalar_type());
  check_param(op, "weight", weight, x);
  const auto rows = x.numel() / std::max<int64_t>(x.size(-1), 1);
  const auto sd = acc_dtype(x.scalar_type());
  for (const auto* t : stats) {
    TORCH_CHECK(t->numel() == rows && t->scalar_type() == sd, "loom::", op, ": ", stat_names,
                " must hold ", rows, " ", sd, " values (one per row of the input), got ",
                t->numel(), " ", t->scalar_type());
    check_same_device(op, x, stat_names, *t);
  }
  check_same_device(op, x, "grad_out", dy);
}

}  // namespace

void check_layer_norm_backward(const at::Tensor& dy, const at::Tensor& x,
                               const at::Tensor& weight, const at::Tensor& mean,
                               const at::Tensor& rstd) {
  check_norm_backward("layer_norm_backward", dy, x, weight, {&mean, &rstd}, "mean and rstd");
}

void check_rms_norm(const at::Tensor& x, const at::Tensor& weight) {
  check_floating("rms_norm", "input", x);
  check_param("rms_norm", "weight", weight, x);
}

void check_rms_norm_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& weight,
                             const at::Tensor& rstd) {
  check_norm_backward("rms_norm_backward", dy, x, weight, {&rstd}, "rstd");
}

void check_rotary(const char* op, const char* arg, const at::Tensor& x, const at::Tensor& cos,
                  const at::Tensor& sin) {
  check_floating(op, arg, x);
  TORCH_CHECK(x.dim() == 4, "loom::", op, ": ", arg, " must be [b, heads, s, d], got ", x.sizes());
  using Named = std::pair<const char*, const at::Tensor*>;
  for (const auto& [name, t] : {Named{"cos", &cos}, Named{"sin", &sin}}) {
    TORCH_CHECK(t->dim() == 4 && (t->size(0) == 1 || t->size(0) == x.size(0)) && t->size(1) == 1 &&
                    t->size(2) == x.size(2),
                "loom::", op, ": ", name, " must be [", x.size(0), " or 1, 1, ", x.size(2),
                ", r] (the tables of the ", arg, "'s positions), got ", t->sizes());
    TORCH_CHECK(t->scalar_type() == x.scalar_type(), "loom::", op, ": ", name, " must be ",
                x.scalar_type(), " (the ", arg, "'s dtype), got ", t->scalar_type());
    check_same_device(op, x, name, *t);
  }
  TORCH_CHECK(cos.sizes() == sin.sizes(), "loom::", op, ": cos and sin must have one shape, got ",
              cos.sizes(), " and ", sin.sizes());
  const int64_t r = cos.size(3);
  TORCH_CHECK(r >= 2 && r % 2 == 0 && r <= x.size(3), "loom::", op,
              ": the rotated width (the tables' last size) must be even and in [2, ", x.size(3),
              "] (the head dimension), got ", r);
}

void check_swiglu(const at::Tensor& x) {
  check_floating("swiglu", "input", x);
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0, "loom::swiglu: input must be [..., 2f] ",
              "(interleaved gate and up), got ", x.sizes());
}

void check_swiglu_backward(const at::Tensor& dy, const at::Tensor& x) {
  check_swiglu(x);
  TORCH_CHECK(dy.sizes() == at::IntArrayRef(with_last_dim(x, x.size(-1) / 2)) &&
                  dy.scalar_type() == x.scalar_type(),
              "loom::swiglu_backward: grad_out must be ", x.scalar_type(), " ",
              at::IntArrayRef(with_last_dim(x, x.size(-1) / 2)), " (the output's shape), got ",
              dy.scalar_type(), " ", dy.sizes());
  check_same_device("swiglu_backward", x, "grad_out", dy);
}

std::vector<int64_t> with_last_dim(const at::Tensor& x, int64_t last) {
  auto shape = x.sizes().vec();
  shape.back() = last;
  return shape;
}

void check_bias_dropout_add(const at::Tensor& x, const std::optional<at::Tensor>& bias,
                            const at::Tensor& residual, double p) {
  check_floating("bias_dropout_add", "input", x);
  check_probability("bias_dropout_add", p);
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == x.scalar_type(),
              "loom::bias_dropout_add: residual must have the input's shape and dtype (",
              x.sizes(), ", ", x.scalar_type(), "), got ", residual.sizes(), ", ",
              residual.scalar_type());
  check_same_device("bias_dropout_add", x, "residual", residual);
  if (bias) check_param("bias_dropout_add", "bias", *bias, x);
}

void check_softmax(const at::Tensor& x, const std::optional<at::Tensor>& mask) {
  check_floating("scaled_masked_softmax", "input", x);
  TORCH_CHECK(x.dim() >= 2, "loom::scaled_masked_softmax: input must be [..., sq, sk], got ",
              x.sizes());
  if (mask) {
    TORCH_CHECK(mask->scalar_type() == at::kBool,
                "loom::scaled_masked_softmax: mask must be bool (true = masked out), got ",
                mask->scalar_type());
    TORCH_CHECK(at::is_expandable_to(mask->sizes(), x.sizes()),
                "loom::scaled_masked_softmax: mask of shape ", mask->sizes(),
                " does not broadcast to the input's shape ", x.sizes());
    check_same_device("scaled_masked_softmax", x, "mask", *mask);
  }
}

void check_softmax_backward(const at::Tensor& dy, const at::Tensor& y) {
  check_floating("scaled_masked_softmax_backward", "output", y);
  TORCH_CHECK(dy.sizes() == y.sizes() && dy.scalar_type() == y.scalar_type(),
              "loom::scaled_masked_softmax_backward: grad_out must match the output (",
              y.sizes(), ", ", y.scalar_type(), "), got ", dy.sizes(), ", ", dy.scalar_type());
  check_same_device("scaled_masked_softmax_backward", y, "grad_out", dy);
}

void check_bias_gelu(const at::Tensor& x, const at::Tensor& bias) {
  check_floating("bias_gelu", "input", x);
  check_param("bias_gelu", "bias", bias, x);
}

ElementLayout dropout_layout(const char* op, const at::Tensor& local,
                             at::IntArrayRef global_shape, at::IntArrayRef offset) {
  try {
    return make_element_layout(local.sizes().vec(), global_shape.vec(), offset.vec());
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK(false, "loom::", op, ": ", e.what());
  }
}

MaskRows prepare_mask(const at::Tensor& mask, const at::Tensor& x) {
  at::Tensor m = mask.expand(x.sizes());
  if (m.stride(-1) != 1) m = m.contiguous();
  const auto opts = at::TensorOptions().dtype(at::kLong).device(x.device());
  at::Tensor offsets = at::zeros({}, opts);
  for (int64_t d = 0; d + 1 < x.dim(); ++d)
    offsets = offsets.unsqueeze(-1) + at::arange(x.size(d), opts) * m.stride(d);
  return {m, offsets.reshape({-1}).contiguous()};
}

}  // namespace loom::ops::internal
