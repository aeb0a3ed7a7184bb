// The run's device, decided once per rank and followed by everything else: parameters,
// optimizer state, pipeline buffers, every tensor given to a collective, KV caches
// (docs/design/devices.md). Three kinds of run:
//   - CPU ranks: device cpu, collectives on Gloo;
//   - GPUs: cuda:<LOCAL_RANK>, made the current CUDA device before any group exists, NCCL;
//   - a device plugin (LOOM_DEVICE_PLUGIN, runtime/device_plugin.h) stands in for the GPU:
//     <plugin>:<LOCAL_RANK>, collectives through the plugin's backend.
// LOOM_DEVICE_COLLECTIVES=gloo runs a device's collectives on Gloo through host copies
// instead, so that several ranks may share one device (NCCL refuses two ranks on one GPU):
// rank r then uses device LOCAL_RANK mod (devices on the host).
#pragma once
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>

namespace loom::runtime {

enum class Collectives { kGloo, kNccl, kPlugin };

struct RunDevice {
  c10::Device device{c10::kCPU};
  Collectives collectives = Collectives::kGloo;
  /// Device tensors go through host memory to Gloo (LOOM_DEVICE_COLLECTIVES=gloo).
  bool host_staged = false;

  bool on_host() const { return device.is_cpu(); }
  /// "cpu, Gloo", "cuda:0, NCCL", "standin:1, plugin libloom_standin_device.so",
  /// "cuda:0, Gloo through host memory".
  std::string describe() const;
};

enum class DeviceKind { kCpu, kAccelerator };

/// Decides the device of the rank with local rank `local_rank` and makes it the current
/// device of this thread. Throws std::invalid_argument (bad input: the run asks for what the
/// host lacks) when the accelerator is missing or has fewer devices than the local ranks need,
/// naming the count and the remedies, or when LOOM_DEVICE_COLLECTIVES is malformed;
/// std::runtime_error when LOOM_DEVICE_PLUGIN cannot be loaded.
RunDevice select_run_device(DeviceKind kind, int local_rank);

/// Bytes of tensors allocated on a device, and the blocks the caching allocator holds for them.
struct DeviceMemoryBytes {
  int64_t allocated = 0;  ///< now (torch.cuda.memory_allocated)
  int64_t peak = 0;       ///< the most at once since the last reset (torch.cuda.max_memory_allocated)
  /// Reserved by the caching allocator from the device, allocated or cached, at its peak since
  /// the last reset (torch.cuda.max_memory_reserved); = peak where nothing is cached (the stand-in).
  int64_t reserved_peak = 0;
};

/// `device`'s allocated and peak bytes from its caching allocator (CUDA's, or a device plugin's
/// that implements c10::DeviceAllocator, as the stand-in's does); nullopt on the CPU or when the
/// allocator keeps no statistics. A host read: it does not wait for the device.
std::optional<DeviceMemoryBytes> device_memory_bytes(c10::Device device);

/// Starts a new peak at the bytes allocated now (torch.cuda.reset_peak_memory_stats); no-op
/// where device_memory_bytes has nothing.
void reset_peak_device_memory(c10::Device device);

/// How many times this process has waited for the device so far (.item(), copies to the host,
/// blocking copies from it, synchronize), as counted by a device plugin that exports the
/// counter (the stand-in does); nullopt otherwise (CPU, CUDA). The step log records it per
/// step, and CI checks that a training step between log intervals never waits.
std::optional<int64_t> device_host_waits();

/// Waits for all work queued on `device` (no-op on the CPU). For timing at log intervals only.
void synchronize(c10::Device device);

}  // namespace loom::runtime
