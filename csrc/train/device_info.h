// The name of the accelerator a rank runs on, for the MFU peak table (planner::peak_tflops_for_device).
#pragma once
#include <c10/core/Device.h>

#include <string>

namespace loom::train {

/// CUDA: the device's marketing name (e.g. "NVIDIA H200"); any other device: its type name
/// ("cpu", or a device plugin's, e.g. "standin"), which has no peak in the table.
std::string accelerator_name(c10::Device device);

}  // namespace loom::train
