// Internal: what the custom autograd functions of this folder (mappings, parallel_linear,
// cross_entropy, recompute) share: the names of torch's autograd Function API, and carrying a
// C++ object (a communicator, a closure) through an autograd context's saved_data, which holds
// IValues only. Include from .cpp files of this folder only.
#pragma once
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/custom_function.h>

#include <utility>

namespace loom::model {
using torch::autograd::AutogradContext;
using torch::autograd::Function;
using torch::autograd::variable_list;
}  // namespace loom::model

namespace loom::model::detail {

template <typename T>
struct Capsule : torch::CustomClassHolder {
  explicit Capsule(T v) : value(std::move(v)) {}
  T value;
};

template <typename T>
c10::IValue make_capsule(T value) {
  return c10::IValue::make_capsule(c10::make_intrusive<Capsule<T>>(std::move(value)));
}

template <typename T>
const T& from_capsule(const c10::IValue& v) {
  auto holder = v.toCapsule();
  return static_cast<const Capsule<T>*>(holder.get())->value;
}

}  // namespace loom::model::detail
