#include "runtime/device_plugin.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <optional>
#include <stdexcept>

namespace loom::runtime {
namespace {

DevicePlugin load(const std::string& path) {
  const auto fail = [&](const std::string& what) {
    return std::runtime_error("LOOM_DEVICE_PLUGIN=" + path + ": " + what);
  };
  // RTLD_GLOBAL: the library's kernels and guard register with the process-wide dispatcher.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!handle) throw fail(std::string("cannot load the library: ") + dlerror());
  auto name = reinterpret_cast<const char* (*)()>(dlsym(handle, "loom_device_plugin_name"));
  auto make = reinterpret_cast<DevicePlugin::MakeBackend>(
      dlsym(handle, "loom_device_plugin_make_backend"));
  if (!name || !make)
    throw fail("not a Loom device plugin (it must export loom_device_plugin_name and "
               "loom_device_plugin_make_backend)");
  DevicePlugin plugin;
  plugin.path = path;
  plugin.device_name = name();
  plugin.make_backend = make;
  plugin.host_waits = reinterpret_cast<int64_t (*)()>(dlsym(handle, "loom_device_plugin_host_waits"));
  return plugin;  // the handle stays open for the life of the process
}

}  // namespace

const DevicePlugin* device_plugin() {
  static std::once_flag once;
  static std::optional<DevicePlugin> plugin;
  static std::string error;
  std::call_once(once, [] {
    const char* path = std::getenv("LOOM_DEVICE_PLUGIN");
    if (!path || !*path) return;
    try {
      plugin = load(path);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  if (!error.empty()) throw std::runtime_error(error);
  return plugin ? &*plugin : nullptr;
}

}  // namespace loom::runtime
