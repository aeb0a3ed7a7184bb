// The stand-in device (tests/standin_device) for tests of Loom's GPU code path on CPU machines:
// points LOOM_DEVICE_PLUGIN at the built library (child worker processes inherit it), so that
// Loom's runtime loads it and an accelerator run lands on "standin:<local rank>".
#pragma once
#include <cstdlib>
#include <string>

namespace loom::test {

inline std::string standin_library() { return LOOM_BINARY_DIR "/lib/libloom_standin_device.so"; }

/// Call before anything asks for the run's device (the plugin is loaded once per process).
inline void use_standin_device() { setenv("LOOM_DEVICE_PLUGIN", standin_library().c_str(), 1); }

}  // namespace loom::test
