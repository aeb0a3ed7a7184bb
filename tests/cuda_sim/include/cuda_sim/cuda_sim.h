// The CUDA execution-model simulator behind tests/cuda_sim/include/cuda_runtime.h (test-only;
// docs/design/cuda_sim.md). A launch runs synchronously, block after block; each CUDA thread
// of a block is a cooperative fiber (ucontext) that runs until it reaches __syncthreads(), a
// warp intrinsic or its end, so the only interleavings are those the execution model allows
// at those points, in the order of the selected Schedule. Misuse of the model (a shuffle mask
// naming an exited lane, a read outside the mask, lanes of one mask at different intrinsics,
// a barrier not every live thread reaches, deadlock) throws cuda_sim::Error naming the kernel,
// block and thread; launch-configuration errors are reported through cudaGetLastError() as
// CUDA does.
#pragma once

#include <driver_types.h>
#include <vector_types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace cuda_sim {

/// Order in which runnable threads of a block are resumed between switch points.
enum class Schedule {
  kRoundRobin,     ///< thread 0, 1, ..., n-1, each to its next switch point; repeat
  kWarpsForward,   ///< warp 0 as far as it can go, then warp 1, ...; blocks in order
  kWarpsBackward,  ///< the last warp first, lanes from 31 down; blocks in reverse order
};
constexpr Schedule kAllSchedules[] = {Schedule::kRoundRobin, Schedule::kWarpsForward,
                                      Schedule::kWarpsBackward};
const char* schedule_name(Schedule s);
void set_schedule(Schedule s);
Schedule schedule();

/// SM count reported by cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount) (default 2).
void set_sm_count(int count);

/// A kernel broke the execution model; what() names the kernel, block and thread.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Number of kernel launches that ran (for tests that check a path was taken).
int64_t launches_run();

enum class WarpOpKind { kShflIdx, kShflUp, kShflDown, kShflXor, kSyncWarp };

/// Runs `body` once per thread of every block of the grid (the launch's arguments were
/// bound by make_launch). Bad configurations set the error cudaGetLastError() returns.
void launch_kernel(const char* name, const void* func, dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, const std::function<void()>& body);

/// __syncthreads() of the running thread; file:line identify the barrier.
void syncthreads(const char* file, int line);

/// One warp intrinsic of the running thread: value is its operand's bits, arg the lane /
/// delta / lane mask; returns the bits it receives once every lane of `mask` has arrived.
uint64_t warp_op(WarpOpKind kind, unsigned mask, uint64_t value, int arg, int width);

/// The running block's dynamic shared memory (exactly the launch's byte count).
void* dynamic_shared();

/// kernel<<<grid, block, smem, stream>>> spelled as make_launch(kernel, ...)(args...): the
/// arguments are converted to the kernel's parameter types and copied once, as CUDA does.
template <typename... P>
struct KernelLaunch {
  void (*kernel)(P...);
  const char* name;
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;

  template <typename... A>
  void operator()(A&&... args) const {
    static_assert(sizeof...(A) == sizeof...(P), "cuda_sim: wrong number of kernel arguments");
    std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
    auto* k = kernel;
    launch_kernel(name, reinterpret_cast<const void*>(k), grid, block, smem, stream,
                  [&] { std::apply(k, params); });
  }
};

template <typename... P>
KernelLaunch<P...> make_launch(void (*kernel)(P...), const char* name, dim3 grid, dim3 block,
                               size_t smem, cudaStream_t stream) {
  return KernelLaunch<P...>{kernel, name, grid, block, smem, stream};
}

}  // namespace cuda_sim
