// Optimizer, LR scheduler and loss scaler state as a checkpoint writer sees it: named tensors
// (saved and restored bit for bit) plus plain JSON values.
#pragma once
#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <map>
#include <string>

namespace loom::train::optim {

struct OptimizerState {
  /// "main/<param name>", "exp_avg/<param name>", "exp_avg_sq/<param name>": fp32 CPU or device
  /// tensors shaped like the parameter (the whole parameter, whatever the sharding).
  std::map<std::string, at::Tensor> tensors;
  /// {"name": "adamw", "step": <successful updates>}.
  nlohmann::json values;
};

}  // namespace loom::train::optim
