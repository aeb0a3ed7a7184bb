// The simulator's own semantics (tests/cuda_sim/include/cuda_sim/cuda_sim.h): shuffles with
// CUDA's lane/width/mask rules, the errors for misuse of masks and barriers, launch limits
// through cudaGetLastError, NaN-filled shared memory, schedules, 2-D grids.
#include <cuda_runtime.h>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace {

using Catch::Matchers::Contains;
using cuda_sim::Schedule;

#define LAUNCH(kernel, grid, block, smem) CUDA_SIM_LAUNCH(kernel, grid, block, smem, nullptr)

template <typename F>
void each_schedule(F f) {
  for (Schedule s : cuda_sim::kAllSchedules) {
    cuda_sim::set_schedule(s);
    INFO("schedule " << cuda_sim::schedule_name(s));
    f();
  }
  cuda_sim::set_schedule(Schedule::kRoundRobin);
}

__global__ void shuffle_kernel(int* out) {
  const int lane = threadIdx.x & 31;
  const int v = 100 + lane;
  out[0 * 32 + lane] = __shfl_xor_sync(0xffffffffu, v, 8, 16);
  out[1 * 32 + lane] = __shfl_xor_sync(0xffffffffu, v, 16, 16);  // later group: own value
  out[2 * 32 + lane] = __shfl_down_sync(0xffffffffu, v, 3, 8);
  out[3 * 32 + lane] = __shfl_up_sync(0xffffffffu, v, 2, 8);
  out[4 * 32 + lane] = __shfl_sync(0xffffffffu, v, 5, 4);
  out[5 * 32 + lane] = __shfl_sync(0xffffffffu, v, 37);  // 37 mod 32
  out[6 * 32 + lane] = static_cast<int>(__shfl_xor_sync(0xffffffffu, 0.5f * v, 1) * 2);
}

TEST_CASE("shuffles follow CUDA's lane, width and segment rules", "[simulator]") {
  each_schedule([] {
    std::vector<int> out(7 * 32, -1);
    LAUNCH(shuffle_kernel, 1, 32, 0)(out.data());
    REQUIRE(cudaGetLastError() == cudaSuccess);
    for (int l = 0; l < 32; ++l) {
      const int seg8 = l & ~7, seg4 = l & ~3;
      CHECK(out[0 * 32 + l] == 100 + (l ^ 8));
      CHECK(out[1 * 32 + l] == ((l ^ 16) < (l & ~15) + 16 ? 100 + (l ^ 16) : 100 + l));
      CHECK(out[2 * 32 + l] == (l + 3 < seg8 + 8 ? 100 + l + 3 : 100 + l));
      CHECK(out[3 * 32 + l] == (l - 2 >= seg8 ? 100 + l - 2 : 100 + l));
      CHECK(out[4 * 32 + l] == 100 + seg4 + 1);
      CHECK(out[5 * 32 + l] == 105);
      CHECK(out[6 * 32 + l] == 100 + (l ^ 1));
    }
  });
}

__global__ void exited_lane_kernel(float* out) {
  if ((threadIdx.x & 31) >= 16) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

__global__ void outside_mask_kernel(float* out) {
  if ((threadIdx.x & 31) < 16) out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, 1.0f, 16);
}

__global__ void own_lane_not_in_mask_kernel(float* out) {
  out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, 1.0f, 1);
}

__global__ void mixed_intrinsics_kernel(float* out) {
  if (threadIdx.x & 1)
    out[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1.0f, 1);
  else
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

__global__ void partial_warp_kernel(float* out) {
  // launched with 48 threads: lanes 16..31 of warp 1 do not exist
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

TEST_CASE("misused warp masks fail, naming the kernel, block and lane", "[simulator]") {
  std::vector<float> out(64);
  each_schedule([&] {
    REQUIRE_THROWS_WITH(LAUNCH(exited_lane_kernel, dim3(2), 32, 0)(out.data()),
                        Contains("kernel exited_lane_kernel, block (") &&
                            (Contains("which has exited") || Contains("returns while lane")));
    REQUIRE_THROWS_WITH(LAUNCH(outside_mask_kernel, 1, 32, 0)(out.data()),
                        Contains("reads lane 16, which is outside the mask 0x0000ffff"));
    REQUIRE_THROWS_WITH(LAUNCH(own_lane_not_in_mask_kernel, 1, 32, 0)(out.data()),
                        Contains("does not name the calling lane"));
    REQUIRE_THROWS_WITH(LAUNCH(mixed_intrinsics_kernel, 1, 32, 0)(out.data()),
                        Contains("lanes of one mask at different intrinsics"));
    REQUIRE_THROWS_WITH(LAUNCH(partial_warp_kernel, 1, 48, 0)(out.data()),
                        Contains("names lane 16, which the block (48 threads) does not have"));
  });
}

__global__ void early_return_kernel(float* out) {
  __shared__ float s[64];
  if (threadIdx.x == 37) return;
  s[threadIdx.x] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = s[63 - threadIdx.x];
}

__global__ void divergent_barrier_kernel(float* out) {
  if (threadIdx.x < 32) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1.0f;
}

__global__ void barrier_in_shuffle_kernel(float* out) {
  if (threadIdx.x == 3) __syncthreads();
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

TEST_CASE("a barrier not every live thread reaches fails", "[simulator]") {
  std::vector<float> out(64);
  each_schedule([&] {
    REQUIRE_THROWS_WITH(LAUNCH(early_return_kernel, 1, 64, 0)(out.data()),
                        Contains("__syncthreads at") &&
                            Contains("a barrier every live thread must reach"));
    REQUIRE_THROWS_WITH(LAUNCH(divergent_barrier_kernel, 1, 64, 0)(out.data()),
                        Contains("divergent barriers"));
    REQUIRE_THROWS_WITH(LAUNCH(barrier_in_shuffle_kernel, 1, 32, 0)(out.data()),
                        Contains("lanes of one mask at different intrinsics"));
  });
}

__global__ void block_sum_kernel(const float* in, float* out) {
  __shared__ float partial[32];
  float v = in[blockIdx.x * blockDim.x + threadIdx.x];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) s += partial[w];
    out[blockIdx.x] = s;
  }
}

TEST_CASE("barriers order shared memory between warps under every schedule", "[simulator]") {
  std::vector<float> in(3 * 256), out(3);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 7);
  each_schedule([&] {
    LAUNCH(block_sum_kernel, 3, 256, 0)(in.data(), out.data());
    for (int b = 0; b < 3; ++b) {
      float want = 0;
      for (int i = 0; i < 256; ++i) want += in[b * 256 + i];
      CHECK(out[b] == want);
    }
  });
}

__global__ void racy_kernel(int* out) {
  __shared__ int flag;
  if (threadIdx.x == 0) flag = 1;
  __syncwarp();
  if (threadIdx.x == 32) *out = flag;  // no __syncthreads: depends on the warps' order
}

TEST_CASE("a missing barrier shows as a result that depends on the schedule", "[simulator]") {
  int out = 0;
  cuda_sim::set_schedule(Schedule::kWarpsForward);
  LAUNCH(racy_kernel, 1, 64, 0)(&out);
  CHECK(out == 1);
  cuda_sim::set_schedule(Schedule::kWarpsBackward);
  LAUNCH(racy_kernel, 1, 64, 0)(&out);
  CHECK(out == -1);  // the NaN bytes shared memory starts with
  cuda_sim::set_schedule(Schedule::kRoundRobin);
}

__global__ void shared_start_kernel(const int* unused, float* out) {
  (void)unused;
  CUDA_SIM_DYNAMIC_SHARED(float, dyn);
  __shared__ float stat[4];
  if (threadIdx.x == 0) {
    out[2 * blockIdx.x] = dyn[5];
    out[2 * blockIdx.x + 1] = stat[3];
    dyn[5] = 1.0f;
    stat[3] = 2.0f;
  }
}

TEST_CASE("shared memory starts every block as NaN", "[simulator]") {
  std::vector<float> out(6, 0.0f);
  LAUNCH(shared_start_kernel, 3, 32, 6 * sizeof(float))(nullptr, out.data());
  REQUIRE(cudaGetLastError() == cudaSuccess);
  for (float v : out) CHECK(std::isnan(v));
}

__global__ void index_kernel(int* out) {
  const unsigned t = threadIdx.y * blockDim.x + threadIdx.x;
  const unsigned b = blockIdx.y * gridDim.x + blockIdx.x;
  out[b * blockDim.x * blockDim.y + t] = static_cast<int>(b * 1000 + t);
}

TEST_CASE("2-D grids and blocks give every thread its indices", "[simulator]") {
  std::vector<int> out(6 * 32, -1);
  each_schedule([&] {
    LAUNCH(index_kernel, dim3(3, 2), dim3(8, 4), 0)(out.data());
    for (int b = 0; b < 6; ++b)
      for (int t = 0; t < 32; ++t) CHECK(out[b * 32 + t] == b * 1000 + t);
  });
}

__global__ void noop_kernel(int* out) {
  if (out) *out = 1;
}

TEST_CASE("launch limits are reported through cudaGetLastError", "[simulator]") {
  int ran = 0;
  const int64_t before = cuda_sim::launches_run();
  LAUNCH(noop_kernel, 1, 1025, 0)(&ran);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  CHECK(cudaGetLastError() == cudaSuccess);  // not sticky
  LAUNCH(noop_kernel, dim3(1, 65536), 32, 0)(&ran);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  LAUNCH(noop_kernel, dim3(1, 1, 65536), 32, 0)(&ran);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  LAUNCH(noop_kernel, 0, 32, 0)(&ran);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  LAUNCH(noop_kernel, 1, dim3(32, 2, 65), 0)(&ran);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  LAUNCH(noop_kernel, 1, 32, 48 * 1024 + 4)(&ran);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(ran == 0);
  CHECK(cuda_sim::launches_run() == before);

  CHECK(cudaFuncSetAttribute(noop_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             227 * 1024 + 1) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  REQUIRE(cudaFuncSetAttribute(noop_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               64 * 1024) == cudaSuccess);
  LAUNCH(noop_kernel, 1, 32, 64 * 1024)(&ran);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(ran == 1);
  LAUNCH(noop_kernel, dim3(1, 65535), 1, 0)(nullptr);  // the largest legal grid.y
  CHECK(cudaGetLastError() == cudaSuccess);
  LAUNCH(noop_kernel, 1, dim3(1, 1, 64), 0)(nullptr);  // the largest legal block.z
  CHECK(cudaGetLastError() == cudaSuccess);
}

}  // namespace
