// The fp32 fast paths' ISA (extensions/src/cpu/isa.h) is ATen's choice, so that the ctest
// entries ops/isa_default and ops/isa_avx2 (ATEN_CPU_CAPABILITY set) really run those variants.
#include <ATen/Version.h>
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "cpu/isa.h"

TEST_CASE("the CPU kernels' ISA follows ATen's, which ATEN_CPU_CAPABILITY lowers", "[ops][isa]") {
  using loom::ops::cpu::Isa;
  const Isa chosen = loom::ops::cpu::isa();
  CAPTURE(loom::ops::cpu::isa_name(chosen));
#if defined(__x86_64__)
  const std::string aten = at::get_cpu_capability();
  CAPTURE(aten);
  REQUIRE(chosen == (aten == "AVX512" ? Isa::kAvx512 : aten == "AVX2" ? Isa::kAvx2 : Isa::kDefault));
#endif
  if (const char* env = std::getenv("ATEN_CPU_CAPABILITY")) {
    const std::string asked = env;
    if (asked == "default") REQUIRE(chosen == Isa::kDefault);
    if (asked == "avx2") REQUIRE(chosen != Isa::kAvx512);
  }
}
