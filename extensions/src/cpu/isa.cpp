#include "isa.h"

#include <ATen/Version.h>

#include <string>

namespace loom::ops::cpu {

Isa isa() {
  static const Isa chosen = [] {
#if defined(__GNUC__) && defined(__x86_64__)
    // ATen's choice by name ("DEFAULT", "AVX2", "AVX512"; its enum's accessor is not exported).
    const std::string aten = at::get_cpu_capability();
    if (aten == "AVX512") return Isa::kAvx512;
    if (aten == "AVX2") return Isa::kAvx2;
#endif
    return Isa::kDefault;
  }();
  return chosen;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    default: return "default";
  }
}

}  // namespace loom::ops::cpu
