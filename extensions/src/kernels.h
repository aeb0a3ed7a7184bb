// Backend implementations of the `loom` ops: one set per device, same signatures.
// CPU: cpu/*.cpp (the reference, vectorised with ATen Vectorized + at::parallel_for).
// CUDA: cuda/*_cuda.cpp (tensor handling) calling the raw-pointer launchers of cuda/*.cu.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <tuple>

namespace loom::ops {

#define LOOM_DECLARE_BACKEND(suffix)                                                        \
  std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_##suffix(                       \
      const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps);   \
  std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_##suffix(              \
      const at::Tensor& dy, const at::Tensor& x, const at::Tensor& weight,                  \
      const at::Tensor& mean, const at::Tensor& rstd);                                      \
  at::Tensor dropout_##suffix(const at::Tensor& x, double p, int64_t seed, int64_t stream,  \
                              at::IntArrayRef global_shape, at::IntArrayRef offset);        \
  at::Tensor dropout_mask_##suffix(const at::Tensor& like, double p, int64_t seed,          \
                                   int64_t stream, at::IntArrayRef global_shape,            \
                                   at::IntArrayRef offset);                                 \
  at::Tensor bias_dropout_add_##suffix(                                                     \
      const at::Tensor& x, const std::optional<at::Tensor>& bias, const at::Tensor& residual, \
      double p, int64_t seed, int64_t stream, at::IntArrayRef global_shape,                 \
      at::IntArrayRef offset);                                                              \
  at::Tensor scaled_masked_softmax_##suffix(                                                \
      const at::Tensor& x, const std::optional<at::Tensor>& mask, double scale, bool causal); \
  at::Tensor scaled_masked_softmax_backward_##suffix(const at::Tensor& dy,                  \
                                                     const at::Tensor& y, double scale);    \
  at::Tensor bias_gelu_##suffix(const at::Tensor& x, const at::Tensor& bias);               \
  at::Tensor bias_gelu_backward_##suffix(const at::Tensor& dy, const at::Tensor& x,         \
                                         const at::Tensor& bias);                           \
  std::tuple<at::Tensor, at::Tensor> rms_norm_##suffix(const at::Tensor& x,                 \
                                                       const at::Tensor& weight, double eps); \
  std::tuple<at::Tensor, at::Tensor> rms_norm_backward_##suffix(                            \
      const at::Tensor& dy, const at::Tensor& x, const at::Tensor& weight,                  \
      const at::Tensor& rstd);                                                              \
  at::Tensor rotary_##suffix(const at::Tensor& x, const at::Tensor& cos,                    \
                             const at::Tensor& sin);                                        \
  at::Tensor rotary_backward_##suffix(const at::Tensor& dy, const at::Tensor& cos,          \
                                      const at::Tensor& sin);                               \
  at::Tensor swiglu_##suffix(const at::Tensor& x);                                          \
  at::Tensor swiglu_backward_##suffix(const at::Tensor& dy, const at::Tensor& x);

LOOM_DECLARE_BACKEND(cpu)
LOOM_DECLARE_BACKEND(cuda)
LOOM_DECLARE_BACKEND(meta)

#undef LOOM_DECLARE_BACKEND

}  // namespace loom::ops
