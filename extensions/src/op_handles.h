// Typed dispatcher handles of the `loom` ops, looked up once. Calling a handle dispatches
// on the arguments (Autograd first, then the device kernel).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <tuple>

namespace loom::ops::handles {

using Tensor2 = std::tuple<at::Tensor, at::Tensor>;
using Tensor3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using OptTensor = std::optional<at::Tensor>;

template <typename Sig>
c10::TypedOperatorHandle<Sig> find(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

#define LOOM_OP_HANDLE(fn, name, ...)                                        \
  inline const c10::TypedOperatorHandle<__VA_ARGS__>& fn() {                 \
    static const auto handle = find<__VA_ARGS__>(name);                      \
    return handle;                                                           \
  }

LOOM_OP_HANDLE(layer_norm, "loom::layer_norm",
               Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, double))
LOOM_OP_HANDLE(layer_norm_backward, "loom::layer_norm_backward",
               Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                       const at::Tensor&, const at::Tensor&))
LOOM_OP_HANDLE(dropout, "loom::dropout",
               at::Tensor(const at::Tensor&, double, int64_t, int64_t, at::IntArrayRef,
                          at::IntArrayRef))
LOOM_OP_HANDLE(dropout_mask, "loom::dropout_mask",
               at::Tensor(const at::Tensor&, double, int64_t, int64_t, at::IntArrayRef,
                          at::IntArrayRef))
LOOM_OP_HANDLE(bias_dropout_add, "loom::bias_dropout_add",
               at::Tensor(const at::Tensor&, const OptTensor&, const at::Tensor&, double,
                          int64_t, int64_t, at::IntArrayRef, at::IntArrayRef))
LOOM_OP_HANDLE(scaled_masked_softmax, "loom::scaled_masked_softmax",
               at::Tensor(const at::Tensor&, const OptTensor&, double, bool))
LOOM_OP_HANDLE(scaled_masked_softmax_backward, "loom::scaled_masked_softmax_backward",
               at::Tensor(const at::Tensor&, const at::Tensor&, double))
LOOM_OP_HANDLE(core_attention, "loom::core_attention",
               at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                          const OptTensor&, double, bool, double, int64_t, int64_t,
                          at::IntArrayRef, at::IntArrayRef))
LOOM_OP_HANDLE(core_attention_backward, "loom::core_attention_backward",
               Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                       const at::Tensor&, const OptTensor&, double, bool, double, int64_t,
                       int64_t, at::IntArrayRef, at::IntArrayRef))
LOOM_OP_HANDLE(paged_attention, "loom::paged_attention",
               at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                          const at::Tensor&, const at::Tensor&, double, const OptTensor&))
LOOM_OP_HANDLE(bias_gelu, "loom::bias_gelu", at::Tensor(const at::Tensor&, const at::Tensor&))
LOOM_OP_HANDLE(bias_gelu_backward, "loom::bias_gelu_backward",
               at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&))
LOOM_OP_HANDLE(rms_norm, "loom::rms_norm",
               Tensor2(const at::Tensor&, const at::Tensor&, double))
LOOM_OP_HANDLE(rms_norm_backward, "loom::rms_norm_backward",
               Tensor2(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&))
LOOM_OP_HANDLE(rotary, "loom::rotary",
               at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&))
LOOM_OP_HANDLE(rotary_backward, "loom::rotary_backward",
               at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&))
LOOM_OP_HANDLE(swiglu, "loom::swiglu", at::Tensor(const at::Tensor&))
LOOM_OP_HANDLE(swiglu_backward, "loom::swiglu_backward",
               at::Tensor(const at::Tensor&, const at::Tensor&))

#undef LOOM_OP_HANDLE

}  // namespace loom::ops::handles
