// The name of the accelerator a rank runs on, for the MFU peak table (flops.h).
#pragma once
#include <ATen/core/Tensor.h>

#include <string>

namespace loom::train {

/// CUDA: the device's marketing name (e.g. "NVIDIA H200"); CPU: "cpu".
std::string accelerator_name(at::Device device);

}  // namespace loom::train
