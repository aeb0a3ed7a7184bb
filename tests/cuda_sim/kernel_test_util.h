// Helpers of the CUDA kernel tests: device buffers, element conversions, comparisons and the
// schedules each launch runs under. Written against the CUDA runtime API only, so the tests
// build both against the simulator (LOOM_CUDA_SIM: tests/cuda_sim/include/cuda_runtime.h)
// and against the real runtime with the nvcc-compiled kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/launchers.h"
#include "reference.h"

namespace loom::cuda_test {

using ops::cuda::DType;
constexpr DType kAllDTypes[] = {DType::kFloat, DType::kBFloat16, DType::kHalf};
constexpr RefImpl kAllRefs[] = {RefImpl::kLoomCpu, RefImpl::kAten};

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat: return "float32";
    case DType::kBFloat16: return "bfloat16";
    case DType::kHalf: return "float16";
  }
  return "?";
}
inline size_t dtype_size(DType t) { return t == DType::kFloat ? 4 : 2; }
inline RefType ref_type(DType t) {
  return t == DType::kFloat ? RefType::kFloat
                            : (t == DType::kBFloat16 ? RefType::kBFloat16 : RefType::kHalf);
}

/// Machine epsilon of the element type (the tolerance unit of the comparisons).
inline double dtype_eps(DType t) {
  return t == DType::kFloat ? 1.2e-7 : (t == DType::kBFloat16 ? 1.0 / 128 : 1.0 / 1024);
}

inline void encode(DType t, float v, void* out) {
  if (t == DType::kFloat) {
    std::memcpy(out, &v, 4);
  } else if (t == DType::kBFloat16) {
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    std::memcpy(out, &h, 2);
  } else {
    const __half h = __float2half_rn(v);
    std::memcpy(out, &h, 2);
  }
}
inline float decode(DType t, const void* in) {
  if (t == DType::kFloat) {
    float v;
    std::memcpy(&v, in, 4);
    return v;
  }
  if (t == DType::kBFloat16) {
    __nv_bfloat16 h;
    std::memcpy(&h, in, 2);
    return __bfloat162float(h);
  }
  __half h;
  std::memcpy(&h, in, 2);
  return __half2float(h);
}

/// The value v becomes in the element type.
inline float round_to(DType t, float v) {
  unsigned char b[4];
  encode(t, v, b);
  return decode(t, b);
}

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}

/// Device memory of `bytes` bytes starting `offset` bytes past a cudaMalloc'd (256-aligned)
/// base and ending exactly where the allocation ends, so that a read or write past the
/// end is an overrun the sanitizers see. offset not a multiple of 16: the misaligned path.
class DeviceBuffer {
 public:
  DeviceBuffer(size_t bytes, size_t offset = 0) : bytes_(bytes) {
    cuda_check(cudaMalloc(&base_, bytes + offset), "cudaMalloc");
    ptr_ = base_ ? static_cast<char*>(base_) + offset : nullptr;
  }
  ~DeviceBuffer() { cudaFree(base_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return bytes_ ? ptr_ : nullptr; }
  size_t bytes() const { return bytes_; }

  void upload(const void* src) {
    if (bytes_ == 0) return;
    cuda_check(cudaMemcpy(ptr_, src, bytes_, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  void download(void* dst) const {
    cuda_check(cudaDeviceSynchronize(), "kernel");
    if (bytes_ == 0) return;
    cuda_check(cudaMemcpy(dst, ptr_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy");
  }
  /// Fills with 0xFF bytes (NaN in every float type), so unwritten outputs show.
  void poison() {
    if (bytes_) cuda_check(cudaMemset(ptr_, 0xFF, bytes_), "cudaMemset");
  }

 private:
  void* base_ = nullptr;
  char* ptr_ = nullptr;
  size_t bytes_;
};

/// Elements of type t on the device, `misalign` elements past an aligned base.
class DeviceArray : public DeviceBuffer {
 public:
  DeviceArray(DType t, size_t n, size_t misalign = 0)
      : DeviceBuffer(n * dtype_size(t), misalign * dtype_size(t)), t_(t), n_(n) {
    poison();
  }
  DeviceArray(DType t, const std::vector<float>& v, size_t misalign = 0)
      : DeviceArray(t, v.size(), misalign) {
    std::vector<unsigned char> raw(bytes());
    for (size_t i = 0; i < v.size(); ++i) encode(t_, v[i], raw.data() + i * dtype_size(t_));
    upload(raw.data());
  }
  std::vector<float> values() const {
    std::vector<unsigned char> raw(bytes());
    download(raw.data());
    std::vector<float> out(n_);
    for (size_t i = 0; i < n_; ++i) out[i] = decode(t_, raw.data() + i * dtype_size(t_));
    return out;
  }
  template <typename P = void>
  P* ptr() const {
    return static_cast<P*>(get());
  }

 private:
  DType t_;
  size_t n_;
};

/// Deterministic values ~ N(mean, sd), rounded to the element type.
inline std::vector<float> random_values(DType t, size_t n, uint32_t seed, float mean = 0.0f,
                                        float sd = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(mean, sd);
  std::vector<float> v(n);
  for (float& x : v) x = round_to(t, dist(gen));
  return v;
}

/// |got - want| <= atol + rtol |want| everywhere (and got finite where want is); reports the
/// worst element.
inline void check_close(const std::vector<float>& got, const std::vector<float>& want,
                        double rtol, double atol, const std::string& what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  size_t bad = 0, worst = 0;
  double worst_excess = -1e300;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    const double excess = std::isfinite(g) || !std::isfinite(w)
                              ? std::fabs(g - w) - (atol + rtol * std::fabs(w))
                              : 1e300;
    if (std::isnan(excess) ? !(std::isnan(g) && std::isnan(w)) : excess > 0) ++bad;
    if (excess > worst_excess || std::isnan(excess)) {
      worst_excess = std::isnan(excess) ? 1e300 : excess;
      worst = i;
    }
  }
  std::ostringstream os;
  if (!got.empty())
    os << bad << " of " << got.size() << " elements off; worst at " << worst << ": got "
       << got[worst] << ", want " << want[worst] << " (rtol " << rtol << ", atol " << atol << ")";
  INFO(os.str());
  CHECK(bad == 0);
}

/// Runs f once per simulator schedule (once on a real GPU), naming the schedule.
inline void for_each_schedule(const std::function<void(const std::string&)>& f) {
#if defined(LOOM_CUDA_SIM)
  struct Restore {
    ~Restore() { cuda_sim::set_schedule(cuda_sim::Schedule::kRoundRobin); }
  } restore;
  for (cuda_sim::Schedule s : cuda_sim::kAllSchedules) {
    cuda_sim::set_schedule(s);
    f(std::string("schedule ") + cuda_sim::schedule_name(s));
  }
#else
  f("GPU");
#endif
}

/// The i-th schedule (round robin over them), for cases too large to run under all three.
inline std::string use_schedule(int i) {
#if defined(LOOM_CUDA_SIM)
  const cuda_sim::Schedule s = cuda_sim::kAllSchedules[i % 3];
  cuda_sim::set_schedule(s);
  return std::string("schedule ") + cuda_sim::schedule_name(s);
#else
  (void)i;
  return "GPU";
#endif
}

inline std::string label(DType t, const std::string& what) {
  return std::string(dtype_name(t)) + ", " + what;
}

}  // namespace loom::cuda_test
