// An out-of-tree accelerator loaded from the shared library named by the environment variable
// LOOM_DEVICE_PLUGIN (docs/design/devices.md, "Device plugins"). Loading the library registers
// a PyTorch PrivateUse1 device (its static initialisers do that); the library also exports a
// c10d backend factory for that device's tensors, which Loom uses in place of NCCL. CI runs
// Loom's GPU code path this way on the CPU-backed stand-in of tests/standin_device; a vendor
// library exporting the same entry points would run Loom on its accelerator.
//
// The contract, C linkage (names as below):
//   const char* loom_device_plugin_name(void);                  // the PrivateUse1 name
//   c10d::Backend* loom_device_plugin_make_backend(c10d::Store* store, int rank, int size,
//                                                 int64_t timeout_ms, int device_index);
// make_backend returns a new reference (Loom reclaims it) bound to device `device_index`.
// Optional:
//   int64_t loom_device_plugin_host_waits(void);  // times the host waited for the device
// (the stand-in counts them so that CI can check a training step never waits: docs/design/devices.md).
#pragma once
#include <cstdint>
#include <string>

namespace c10d {
class Backend;
class Store;
}  // namespace c10d

namespace loom::runtime {

struct DevicePlugin {
  using MakeBackend = c10d::Backend* (*)(c10d::Store* store, int rank, int size,
                                         int64_t timeout_ms, int device_index);
  std::string path;         ///< the library's path, as given
  std::string device_name;  ///< its PrivateUse1 backend name, e.g. "standin"
  MakeBackend make_backend = nullptr;
  /// The optional host-wait counter; nullptr when the library does not export it.
  int64_t (*host_waits)() = nullptr;
};

/// The plugin named by LOOM_DEVICE_PLUGIN, loaded (dlopen, RTLD_GLOBAL) on the first call;
/// nullptr when the variable is unset or empty. Throws std::runtime_error naming the file and
/// what is missing when the library cannot be loaded or lacks an entry point.
const DevicePlugin* device_plugin();

}  // namespace loom::runtime
