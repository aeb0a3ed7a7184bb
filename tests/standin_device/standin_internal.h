// What the device (standin_device.cpp) shares with the communicator (standin_backend.cpp).
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <string>

namespace loom::standin {

/// "standin:<index>" or "cpu" etc., as c10::Device prints.
std::string device_name(const c10::Device& device);

/// The number of standin devices (LOOM_STANDIN_DEVICE_COUNT, default 16).
int device_count();

/// A CPU tensor over the same memory as the standin tensor `t` (same data pointer, sizes,
/// strides, storage offset, dtype); it keeps t's storage alive. Writes through it land in t.
at::Tensor alias_as_cpu(const at::Tensor& t);

}  // namespace loom::standin
