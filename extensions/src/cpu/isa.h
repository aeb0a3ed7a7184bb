// Runtime choice of the x86 instruction set for the CPU kernels that have fp32 fast paths
// (paged attention, bias-GeLU). libloom_ops is compiled for baseline x86-64 (SSE2), so such a
// kernel's body is an always-inline function compiled three times, in functions marked with
// LOOM_TARGET_AVX512 / LOOM_TARGET_AVX2 / nothing, and `pick_isa` returns the one to call.
// The choice follows ATen's (at::get_cpu_capability): the best the CPU supports,
// lowered by the environment variable ATEN_CPU_CAPABILITY=default|avx2|avx512 as PyTorch
// documents, which is how the tests run every variant on one machine.
#pragma once

namespace loom::ops::cpu {

enum class Isa { kDefault, kAvx2, kAvx512 };

/// The ISA the fast paths use in this process (read once).
Isa isa();

/// "default", "avx2" or "avx512".
const char* isa_name(Isa isa);

/// The variant of a kernel for isa().
template <typename Fn>
Fn pick_isa(Fn avx512, Fn avx2, Fn fallback) {
  switch (isa()) {
    case Isa::kAvx512: return avx512;
    case Isa::kAvx2: return avx2;
    default: return fallback;
  }
}

}  // namespace loom::ops::cpu

#if defined(__GNUC__) && defined(__x86_64__)
#define LOOM_TARGET_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,fma")))
#define LOOM_TARGET_AVX2 __attribute__((target("avx2,fma")))
#else
#define LOOM_TARGET_AVX512
#define LOOM_TARGET_AVX2
#endif
