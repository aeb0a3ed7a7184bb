#include "train/device_info.h"

#include <ATen/cuda/CUDAContext.h>

namespace loom::train {

std::string accelerator_name(at::Device device) {
  if (device.is_cuda()) return at::cuda::getDeviceProperties(device.index())->name;
  return "cpu";
}

}  // namespace loom::train
