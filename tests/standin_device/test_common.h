// Shared by the stand-in device's tests: Catch2 (v3, or v2 as Debian 12 ships it), loading the
// plugin by path like Loom's runtime does, and small helpers.
#pragma once
// Include every torch header before this one: c10's logging defines a CHECK macro of its own,
// which would replace Catch's.
#include <ATen/ATen.h>
#ifdef CHECK
#undef CHECK
#endif

#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_test_macros.hpp>
#else
#if defined(LOOM_STANDIN_CATCH2_MAIN) && defined(LOOM_STANDIN_MAIN_TU)
#define CATCH_CONFIG_MAIN
#endif
#include <catch2/catch.hpp>
#endif

#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>

namespace c10d {
class Backend;
class Store;
}  // namespace c10d

namespace standin_test {

/// The entry points of libloom_standin_device.so, found with dlsym.
struct Plugin {
  void* handle = nullptr;
  const char* (*name)() = nullptr;
  int64_t (*current_bytes)(int) = nullptr;
  int64_t (*peak_bytes)(int) = nullptr;
  void (*reset_peak)(int) = nullptr;
  int (*device_count)() = nullptr;
  c10d::Backend* (*make_backend)(c10d::Store*, int, int, int64_t, int) = nullptr;
};

template <typename F>
inline void find_symbol(void* handle, const char* name, F*& out) {
  void* p = dlsym(handle, name);
  if (p == nullptr) throw std::runtime_error(std::string("dlsym ") + name + ": " + dlerror());
  out = reinterpret_cast<F*>(p);
}

/// Loads the library (once per process) from the path the build passes in.
inline const Plugin& plugin() {
  static const Plugin p = [] {
    Plugin r;
    r.handle = dlopen(LOOM_STANDIN_LIBRARY, RTLD_NOW | RTLD_GLOBAL);
    if (r.handle == nullptr) {
      throw std::runtime_error(std::string("dlopen " LOOM_STANDIN_LIBRARY ": ") + dlerror());
    }
    find_symbol(r.handle, "loom_device_plugin_name", r.name);
    find_symbol(r.handle, "loom_standin_current_bytes", r.current_bytes);
    find_symbol(r.handle, "loom_standin_peak_bytes", r.peak_bytes);
    find_symbol(r.handle, "loom_standin_reset_peak", r.reset_peak);
    find_symbol(r.handle, "loom_standin_device_count", r.device_count);
    find_symbol(r.handle, "loom_device_plugin_make_backend", r.make_backend);
    return r;
  }();
  return p;
}

/// standin:<index>, loading the plugin first.
inline c10::Device standin(int index = 0) {
  plugin();
  return c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index));
}

/// The message of what f throws ("" when it does not throw).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

/// Bitwise equality of two tensors (any devices; compared on the host).
inline bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor x = a.detach().cpu();
  at::Tensor y = b.detach().cpu();
  if (x.sizes() != y.sizes() || x.scalar_type() != y.scalar_type()) return false;
  if (x.numel() == 0) return true;
  x = x.contiguous();
  y = y.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0;
}

}  // namespace standin_test
