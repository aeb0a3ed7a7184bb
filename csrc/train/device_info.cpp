#include "train/device_info.h"

#include <ATen/cuda/CUDAContext.h>

namespace loom::train {

std::string accelerator_name(c10::Device device) {
  if (device.is_cuda()) return at::cuda::getDeviceProperties(device.index())->name;
  return c10::DeviceTypeName(device.type(), /*lower_case=*/true);
}

}  // namespace loom::train
