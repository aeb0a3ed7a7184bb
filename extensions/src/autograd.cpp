// Autograd kernels of the `loom` ops: each forward redispatches below autograd to the
// device kernel and saves what its backward op needs. Dropout saves no mask: backward
// regenerates it from (p, seed, stream, global block). core_attention saves q, k, v only
// (selective recomputation).
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "op_handles.h"

namespace loom::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptTensor = std::optional<at::Tensor>;

/// Sum of a [..., h] gradient over every dimension but the last, in fp32, as `like`'s dtype.
at::Tensor sum_to_last_dim(const at::Tensor& grad, const at::Tensor& like) {
  const auto acc = grad.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  return grad.reshape({-1, grad.size(-1)}).sum(0, false, acc).to(like.scalar_type());
}

void save_dropout(AutogradContext* ctx, double p, int64_t seed, int64_t stream,
                  at::IntArrayRef global_shape, at::IntArrayRef offset) {
  ctx->saved_data["p"] = p;
  ctx->saved_data["seed"] = seed;
  ctx->saved_data["stream"] = stream;
  ctx->saved_data["global_shape"] = global_shape.vec();
  ctx->saved_data["offset"] = offset.vec();
}

/// dropout(grad) with the saved key: the backward of every dropout is the same mask.
at::Tensor replay_dropout(AutogradContext* ctx, const at::Tensor& grad) {
  const auto gs = ctx->saved_data["global_shape"].toIntVector();
  const auto off = ctx->saved_data["offset"].toIntVector();
  return handles::dropout().call(grad, ctx->saved_data["p"].toDouble(),
                                 ctx->saved_data["seed"].toInt(),
                                 ctx->saved_data["stream"].toInt(), gs, off);
}

struct LayerNormFn : torch::autograd::Function<LayerNormFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x,
                               const at::Tensor& weight, const at::Tensor& bias, double eps) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, mean, rstd] = handles::layer_norm().call(x, weight, bias, eps);
    ctx->save_for_backward({x, weight, mean, rstd});
    ctx->mark_non_differentiable({mean, rstd});
    return {y, mean, rstd};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    auto [dx, dw, db] =
        handles::layer_norm_backward().call(grads[0], saved[0], saved[1], saved[2], saved[3]);
    return {dx, dw, db, at::Tensor()};
  }
};

struct DropoutFn : torch::autograd::Function<DropoutFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, double p, int64_t seed,
                            int64_t stream, at::IntArrayRef global_shape,
                            at::IntArrayRef offset) {
    at::AutoDispatchBelowADInplaceOrView guard;
    save_dropout(ctx, p, seed, stream, global_shape, offset);
    return handles::dropout().call(x, p, seed, stream, global_shape, offset);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {replay_dropout(ctx, grads[0]), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

struct BiasDropoutAddFn : torch::autograd::Function<BiasDropoutAddFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const OptTensor& bias,
                            const at::Tensor& residual, double p, int64_t seed, int64_t stream,
                            at::IntArrayRef global_shape, at::IntArrayRef offset) {
    at::AutoDispatchBelowADInplaceOrView guard;
    save_dropout(ctx, p, seed, stream, global_shape, offset);
    ctx->saved_data["has_bias"] = bias.has_value();
    if (bias) ctx->save_for_backward({*bias});
    return handles::bias_dropout_add().call(x, bias, residual, p, seed, stream, global_shape,
                                            offset);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& g = grads[0];
    at::Tensor dx = replay_dropout(ctx, g);
    at::Tensor dbias;
    if (ctx->saved_data["has_bias"].toBool())
      dbias = sum_to_last_dim(dx, ctx->get_saved_variables()[0]);
    return {dx, dbias, g, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct SoftmaxFn : torch::autograd::Function<SoftmaxFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const OptTensor& mask,
                            double scale, bool causal) {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor y = handles::scaled_masked_softmax().call(x, mask, scale, causal);
    ctx->save_for_backward({y});
    ctx->saved_data["scale"] = scale;
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor y = ctx->get_saved_variables()[0];
    at::Tensor dx = handles::scaled_masked_softmax_backward().call(
        grads[0], y, ctx->saved_data["scale"].toDouble());
    return {dx, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct CoreAttentionFn : torch::autograd::Function<CoreAttentionFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const OptTensor& mask, double scale,
                            bool causal, double p, int64_t seed, int64_t stream,
                            at::IntArrayRef global_shape, at::IntArrayRef offset) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({q, k, v, mask.value_or(at::Tensor())});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["causal"] = causal;
    save_dropout(ctx, p, seed, stream, global_shape, offset);
    return handles::core_attention().call(q, k, v, mask, scale, causal, p, seed, stream,
                                          global_shape, offset);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const OptTensor mask = s[3].defined() ? OptTensor(s[3]) : std::nullopt;
    const auto gs = ctx->saved_data["global_shape"].toIntVector();
    const auto off = ctx->saved_data["offset"].toIntVector();
    auto [dq, dk, dv] = handles::core_attention_backward().call(
        grads[0], s[0], s[1], s[2], mask, ctx->saved_data["scale"].toDouble(),
        ctx->saved_data["causal"].toBool(), ctx->saved_data["p"].toDouble(),
        ctx->saved_data["seed"].toInt(), ctx->saved_data["stream"].toInt(), gs, off);
    variable_list out(11);
    out[0] = dq;
    out[1] = dk;
    out[2] = dv;
    return out;
  }
};

struct BiasGeluFn : torch::autograd::Function<BiasGeluFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& bias) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({x, bias});
    return handles::bias_gelu().call(x, bias);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    at::Tensor dx = handles::bias_gelu_backward().call(grads[0], s[0], s[1]);
    return {dx, sum_to_last_dim(dx, s[1])};
  }
};

struct RmsNormFn : torch::autograd::Function<RmsNormFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                               double eps) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, rstd] = handles::rms_norm().call(x, weight, eps);
    ctx->save_for_backward({x, weight, rstd});
    ctx->mark_non_differentiable({rstd});
    return {y, rstd};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const auto s = ctx->get_saved_variables();
    auto [dx, dw] = handles::rms_norm_backward().call(grads[0], s[0], s[1], s[2]);
    return {dx, dw, at::Tensor()};
  }
};

struct RotaryFn : torch::autograd::Function<RotaryFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin) {
    // The tables are functions of positions: their gradient is never needed, and a silent
    // zero would be wrong.
    TORCH_CHECK(!cos.requires_grad() && !sin.requires_grad(),
                "loom::rotary: cos and sin must not require grad (the op differentiates in the "
                "input only)");
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({cos, sin});
    return handles::rotary().call(x, cos, sin);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    return {handles::rotary_backward().call(grads[0], s[0], s[1]), at::Tensor(), at::Tensor()};
  }
};

struct SwigluFn : torch::autograd::Function<SwigluFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({x});
    return handles::swiglu().call(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {handles::swiglu_backward().call(grads[0], ctx->get_saved_variables()[0])};
  }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_autograd(const at::Tensor& x,
                                                                   const at::Tensor& weight,
                                                                   const at::Tensor& bias,
                                                                   double eps) {
  auto out = LayerNormFn::apply(x, weight, bias, eps);
  return {out[0], out[1], out[2]};
}

at::Tensor dropout_autograd(const at::Tensor& x, double p, int64_t seed, int64_t stream,
                            at::IntArrayRef global_shape, at::IntArrayRef offset) {
  return DropoutFn::apply(x, p, seed, stream, global_shape, offset);
}

at::Tensor bias_dropout_add_autograd(const at::Tensor& x, const OptTensor& bias,
                                     const at::Tensor& residual, double p, int64_t seed,
                                     int64_t stream, at::IntArrayRef global_shape,
                                     at::IntArrayRef offset) {
  return BiasDropoutAddFn::apply(x, bias, residual, p, seed, stream, global_shape, offset);
}

at::Tensor softmax_autograd(const at::Tensor& x, const OptTensor& mask, double scale,
                            bool causal) {
  return SoftmaxFn::apply(x, mask, scale, causal);
}

at::Tensor core_attention_autograd(const at::Tensor& q, const at::Tensor& k,
                                   const at::Tensor& v, const OptTensor& mask, double scale,
                                   bool causal, double p, int64_t seed, int64_t stream,
                                   at::IntArrayRef global_shape, at::IntArrayRef offset) {
  return CoreAttentionFn::apply(q, k, v, mask, scale, causal, p, seed, stream, global_shape,
                                offset);
}

at::Tensor bias_gelu_autograd(const at::Tensor& x, const at::Tensor& bias) {
  return BiasGeluFn::apply(x, bias);
}

std::tuple<at::Tensor, at::Tensor> rms_norm_autograd(const at::Tensor& x, const at::Tensor& weight,
                                                     double eps) {
  auto out = RmsNormFn::apply(x, weight, eps);
  return {out[0], out[1]};
}

at::Tensor rotary_autograd(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return RotaryFn::apply(x, cos, sin);
}

at::Tensor swiglu_autograd(const at::Tensor& x) { return SwigluFn::apply(x); }

}  // namespace
}  // namespace loom::ops

TORCH_LIBRARY_IMPL(loom, Autograd, m) {
  m.impl("layer_norm", &loom::ops::layer_norm_autograd);
  m.impl("dropout", &loom::ops::dropout_autograd);
  m.impl("bias_dropout_add", &loom::ops::bias_dropout_add_autograd);
  m.impl("scaled_masked_softmax", &loom::ops::softmax_autograd);
  m.impl("core_attention", &loom::ops::core_attention_autograd);
  m.impl("bias_gelu", &loom::ops::bias_gelu_autograd);
  m.impl("rms_norm", &loom::ops::rms_norm_autograd);
  m.impl("rotary", &loom::ops::rotary_autograd);
  m.impl("swiglu", &loom::ops::swiglu_autograd);
}
