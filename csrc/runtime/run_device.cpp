#include "runtime/run_device.h"

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstdlib>
#include <stdexcept>

#include "runtime/device_plugin.h"

namespace loom::runtime {
namespace {

// LOOM_DEVICE_COLLECTIVES: unset/empty = the device's own communicator, "gloo" = host-staged.
bool host_staged_from_env() {
  const char* v = std::getenv("LOOM_DEVICE_COLLECTIVES");
  if (!v || !*v) return false;
  const std::string value = v;
  if (value == "gloo") return true;
  throw std::invalid_argument("LOOM_DEVICE_COLLECTIVES: expected 'gloo' (or unset), found '" + value +
                           "'");
}

std::string collectives_name(const RunDevice& d) {
  if (d.host_staged) return "Gloo through host memory";
  switch (d.collectives) {
    case Collectives::kGloo: return "Gloo";
    case Collectives::kNccl: return "NCCL";
    case Collectives::kPlugin: {
      const auto* plugin = device_plugin();
      return "plugin " + (plugin ? plugin->path : std::string("?"));
    }
  }
  return "?";
}

}  // namespace

std::string RunDevice::describe() const { return device.str() + ", " + collectives_name(*this); }

RunDevice select_run_device(DeviceKind kind, int local_rank) {
  RunDevice out;
  if (kind == DeviceKind::kCpu) return out;
  const DevicePlugin* plugin = device_plugin();
  const c10::DeviceType type = plugin ? c10::DeviceType::PrivateUse1 : c10::DeviceType::CUDA;
  out.collectives = plugin ? Collectives::kPlugin : Collectives::kNccl;
  out.host_staged = host_staged_from_env();
  if (out.host_staged) out.collectives = Collectives::kGloo;

  const auto* guard = c10::impl::getDeviceGuardImpl(type);
  const int count = guard->deviceCount();
  const std::string what = plugin ? "'" + plugin->device_name + "' device" : "CUDA device";
  if (count < 1)
    throw std::invalid_argument("the run asks for an accelerator but torch sees no " + what +
                                " on this host; run on CPU ranks instead (loom train: "
                                "trainer.accelerator=cpu; loom generate and loom plan calibrate: "
                                "--accelerator cpu)");
  int index = local_rank;
  if (local_rank >= count) {
    if (!out.host_staged)
      throw std::invalid_argument(
          "local rank " + std::to_string(local_rank) + " needs " + what + " " +
          std::to_string(local_rank) + " but this host has " + std::to_string(count) +
          ": start at most one rank per device (trainer.devices), or set "
          "LOOM_DEVICE_COLLECTIVES=gloo to let ranks share devices");
    index = local_rank % count;
  }
  out.device = c10::Device(type, static_cast<c10::DeviceIndex>(index));
  // The current device must be set before any communicator or tensor exists (NCCL binds its
  // communicators to it; kernels launch on it).
  guard->setDevice(out.device);
  return out;
}

namespace {
c10::DeviceAllocator* device_allocator(c10::Device device) {
  if (device.is_cpu()) return nullptr;
  return dynamic_cast<c10::DeviceAllocator*>(c10::GetAllocator(device.type()));
}
}  // namespace

std::optional<DeviceMemoryBytes> device_memory_bytes(c10::Device device) {
  auto* allocator = device_allocator(device);
  if (!allocator) return std::nullopt;
  const auto stats = allocator->getDeviceStats(device.index());
  const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  const auto& allocated = stats.allocated_bytes[all];
  return DeviceMemoryBytes{allocated.current, allocated.peak, stats.reserved_bytes[all].peak};
}

void reset_peak_device_memory(c10::Device device) {
  if (auto* allocator = device_allocator(device)) allocator->resetPeakStats(device.index());
}

std::optional<int64_t> device_host_waits() {
  const DevicePlugin* plugin = device_plugin();
  if (!plugin || !plugin->host_waits) return std::nullopt;
  return plugin->host_waits();
}

void synchronize(c10::Device device) {
  if (device.is_cpu()) return;
  c10::impl::getDeviceGuardImpl(device.type())->synchronizeDevice(device.index());
}

}  // namespace loom::runtime
