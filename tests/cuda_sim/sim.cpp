// The CUDA execution-model simulator (cuda_sim.h): fibers, schedules, barrier and warp
// semantics, launch checks and the runtime API functions the kernels and tests call.
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define CUDA_SIM_ASAN 1
#endif

uint3 threadIdx;
uint3 blockIdx;
dim3 blockDim;
dim3 gridDim;

// Bounds of the section holding every static __shared__ variable (absent: no kernel has one).
extern "C" char __start_cuda_sim_shared[] __attribute__((weak));
extern "C" char __stop_cuda_sim_shared[] __attribute__((weak));

namespace cuda_sim {
namespace {

constexpr int kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxGridX = 2147483647u, kMaxGridYZ = 65535u;
constexpr int kDefaultDynamicSmem = 48 * 1024;   // without cudaFuncSetAttribute
constexpr int kMaxDynamicSmemOptin = 227 * 1024; // sm_90's opt-in limit
#if defined(CUDA_SIM_ASAN)
constexpr size_t kStackBytes = 256 * 1024;  // ASan's redzones make frames larger
#else
constexpr size_t kStackBytes = 64 * 1024;
#endif

enum class State { kReady, kBarrier, kWarpOp, kExited };

const char* op_name(WarpOpKind k) {
  switch (k) {
    case WarpOpKind::kShflIdx: return "__shfl_sync";
    case WarpOpKind::kShflUp: return "__shfl_up_sync";
    case WarpOpKind::kShflDown: return "__shfl_down_sync";
    case WarpOpKind::kShflXor: return "__shfl_xor_sync";
    case WarpOpKind::kSyncWarp: return "__syncwarp";
  }
  return "?";
}

// Context switching. On x86-64 a fiber's context is its saved stack pointer and
// cuda_sim_switch (below) saves and restores only the callee-saved registers and the FP
// control words, without the two signal-mask system calls of each glibc swapcontext (the
// LayerNorm backward test starts over 3 million threads: 3.5 s instead of 5.9 s). Elsewhere, or
// with -DCUDA_SIM_UCONTEXT: ucontext.
#if defined(__x86_64__) && !defined(CUDA_SIM_UCONTEXT)
extern "C" void cuda_sim_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .globl cuda_sim_switch
  .type cuda_sim_switch, @function
cuda_sim_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size cuda_sim_switch, .-cuda_sim_switch
)");

struct Context {
  void* sp = nullptr;
};
inline void switch_context(Context* from, Context* to) { cuda_sim_switch(&from->sp, to->sp); }
// A fresh context on [stack, stack + size) whose first switch enters entry().
inline void make_context(Context* c, char* stack, size_t size, void (*entry)()) {
  auto* sp = reinterpret_cast<uintptr_t*>(
      (reinterpret_cast<uintptr_t>(stack) + size) & ~static_cast<uintptr_t>(15));
  *--sp = 0;                                    // entry's return address: it never returns
  *--sp = reinterpret_cast<uintptr_t>(entry);  // where cuda_sim_switch's ret goes
  for (int r = 0; r < 6; ++r) *--sp = 0;       // rbp rbx r12 r13 r14 r15
  *--sp = 0x1F80u | (uint64_t{0x037F} << 32);  // default MXCSR and x87 control word
  c->sp = sp;
}
#else
struct Context {
  ucontext_t uc;
};
inline void switch_context(Context* from, Context* to) { swapcontext(&from->uc, &to->uc); }
inline void make_context(Context* c, char* stack, size_t size, void (*entry)()) {
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = stack;
  c->uc.uc_stack.ss_size = size;
  c->uc.uc_link = nullptr;
  makecontext(&c->uc, entry, 0);
}
#endif

struct Fiber {
  Context ctx;
  char* stack = nullptr;  // usable bytes [stack, stack + kStackBytes), a guard page below
};

struct Thread {
  State state = State::kReady;
  uint3 idx{};
  int linear = 0;
  const char* bar_file = nullptr;  // __syncthreads it waits at
  int bar_line = 0;
  WarpOpKind op = WarpOpKind::kSyncWarp;  // warp intrinsic it waits in
  unsigned mask = 0;
  int width = 32, arg = 0;
  uint64_t value = 0, result = 0;
};

struct Sim {
  Schedule schedule = Schedule::kRoundRobin;
  int sm_count = 2;
  cudaError_t last_error = cudaSuccess;
  std::map<const void*, int> max_dynamic_smem;  // cudaFuncSetAttribute
  int64_t launches = 0;

  std::vector<Fiber> fibers;  // grows to the largest block seen; stacks are reused
  Context sched_ctx;
  const char* kernel = nullptr;
  const std::function<void()>* body = nullptr;
  std::vector<Thread> threads;
  int current = -1;  // running thread, -1 in the scheduler
  std::string error; // set by a failing thread; the scheduler throws it
  void* dyn_smem = nullptr;
  size_t dyn_bytes = 0;
#if defined(CUDA_SIM_ASAN)
  void* sched_fake_stack = nullptr;
  const void* sched_stack_bottom = nullptr;
  size_t sched_stack_size = 0;
#endif
};

Sim& sim() {
  static Sim s;
  return s;
}

std::string where(const Sim& s, int t) {
  std::ostringstream os;
  os << "cuda_sim: kernel " << s.kernel << ", block (" << blockIdx.x << "," << blockIdx.y << ","
     << blockIdx.z << ")";
  if (t >= 0) {
    const Thread& th = s.threads[t];
    os << ", thread (" << th.idx.x << "," << th.idx.y << "," << th.idx.z << ") = warp "
       << (th.linear >> 5) << " lane " << (th.linear & 31);
  }
  os << " [" << schedule_name(s.schedule) << " schedule]: ";
  return os.str();
}

std::string hex(unsigned v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

std::string barrier_site(const Thread& t) {
  return std::string("__syncthreads at ") + t.bar_file + ":" + std::to_string(t.bar_line);
}

// Frames that are switched away from for good keep their redzones' poison in ASan's shadow,
// and GCC's instrumentation only poisons redzones on entry: later frames at those addresses
// would see stale poison. So the two frames every exiting thread leaves behind have no
// redzones (no_sanitize_address), and the stacks of threads abandoned after an error are
// unpoisoned when their launch ends.
#if defined(CUDA_SIM_ASAN)
#define CUDA_SIM_NO_REDZONES __attribute__((no_sanitize_address))
#else
#define CUDA_SIM_NO_REDZONES
#endif

// Switches from the running thread back to the scheduler (exiting: never resumed again).
CUDA_SIM_NO_REDZONES void to_scheduler(bool exiting) {
  Sim& s = sim();
  Fiber& f = s.fibers[s.current];
#if defined(CUDA_SIM_ASAN)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(exiting ? nullptr : &fake, s.sched_stack_bottom,
                                 s.sched_stack_size);
#else
  (void)exiting;
#endif
  switch_context(&f.ctx, &s.sched_ctx);
#if defined(CUDA_SIM_ASAN)
  __sanitizer_finish_switch_fiber(fake, &s.sched_stack_bottom, &s.sched_stack_size);
#endif
}

// Records an error found by the running thread (about thread `who`) and leaves the running
// thread suspended for good: the scheduler throws the error.
[[noreturn]] void fail_at(int who, const std::string& what) {
  Sim& s = sim();
  s.error = where(s, who) + what;
  to_scheduler(false);
  std::abort();  // the scheduler never resumes a failed thread
}

[[noreturn]] void fail(const std::string& what) { fail_at(sim().current, what); }

void thread_exits() {
  Sim& s = sim();
  Thread& t = s.threads[s.current];
  const int n = static_cast<int>(s.threads.size());
  for (int i = 0; i < n; ++i) {
    const Thread& o = s.threads[i];
    if (o.state == State::kBarrier)
      fail("returns while thread " + std::to_string(i) + " waits at " + barrier_site(o) +
           ": a barrier every live thread must reach");
  }
  const int warp = t.linear >> 5, lane = t.linear & 31;
  for (int l = 0; l < 32 && warp * 32 + l < n; ++l) {
    const Thread& o = s.threads[warp * 32 + l];
    if (o.state == State::kWarpOp && ((o.mask >> lane) & 1u))
      fail("returns while lane " + std::to_string(l) + " waits for it in " + op_name(o.op) +
           " with mask " + hex(o.mask));
  }
  t.state = State::kExited;
}

CUDA_SIM_NO_REDZONES void fiber_main() {
  Sim& s = sim();
#if defined(CUDA_SIM_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &s.sched_stack_bottom, &s.sched_stack_size);
#endif
  (*s.body)();
  thread_exits();
  to_scheduler(true);
  std::abort();
}

void resume(int i) {
  Sim& s = sim();
  Fiber& f = s.fibers[i];
  s.current = i;
  threadIdx = s.threads[i].idx;
#if defined(CUDA_SIM_ASAN)
  __sanitizer_start_switch_fiber(&s.sched_fake_stack, f.stack, kStackBytes);
#endif
  switch_context(&s.sched_ctx, &f.ctx);
#if defined(CUDA_SIM_ASAN)
  __sanitizer_finish_switch_fiber(s.sched_fake_stack, nullptr, nullptr);
#endif
  s.current = -1;
  if (!s.error.empty()) {
    std::string e;
    e.swap(s.error);
    throw Error(e);
  }
}

void grow_fibers(size_t n) {
  Sim& s = sim();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  while (s.fibers.size() < n) {
    void* p = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("cuda_sim: cannot map a fiber stack");
    mprotect(p, page, PROT_NONE);  // overflow faults instead of corrupting a neighbour
    Fiber f;
    f.stack = static_cast<char*>(p) + page;
    s.fibers.push_back(f);
  }
}

// Static __shared__ and dynamic shared memory start each block as NaN bytes (0xFF: a NaN in
// fp32, bf16 and fp16), so a read before any write shows in the results.
__attribute__((no_sanitize_address)) void poison_shared() {
  Sim& s = sim();
  if (__start_cuda_sim_shared && __stop_cuda_sim_shared)
    for (volatile char* p = __start_cuda_sim_shared; p < __stop_cuda_sim_shared; ++p) *p = '\xff';
  if (s.dyn_bytes) std::memset(s.dyn_smem, 0xFF, s.dyn_bytes);
}

// A warp intrinsic is complete: every lane of `mask` in `warp` gets its value.
void complete_warp_op(int warp, unsigned mask) {
  Sim& s = sim();
  for (int l = 0; l < 32; ++l) {
    if (!((mask >> l) & 1u)) continue;
    Thread& t = s.threads[warp * 32 + l];
    const int w = t.width, seg = l & ~(w - 1);
    int src = l;
    switch (t.op) {
      case WarpOpKind::kShflIdx: src = seg + (t.arg & (w - 1)); break;
      case WarpOpKind::kShflUp: src = l - t.arg >= seg ? l - t.arg : l; break;
      case WarpOpKind::kShflDown: src = l + t.arg < seg + w ? l + t.arg : l; break;
      case WarpOpKind::kShflXor: src = (l ^ t.arg) < seg + w ? (l ^ t.arg) : l; break;
      case WarpOpKind::kSyncWarp: break;
    }
    if (src != l && !((mask >> src) & 1u))
      fail_at(warp * 32 + l, std::string(op_name(t.op)) + " reads lane " + std::to_string(src) +
                                 ", which is outside the mask " + hex(mask) +
                                 " (its value is undefined)");
    t.result = s.threads[warp * 32 + src].value;
  }
  for (int l = 0; l < 32; ++l)
    if ((mask >> l) & 1u) s.threads[warp * 32 + l].state = State::kReady;
}

void run_block() {
  Sim& s = sim();
  const int n = static_cast<int>(s.threads.size());
  const int warps = (n + 31) / 32;
  for (int i = 0; i < n; ++i) {
    Thread& t = s.threads[i];
    t = Thread{};
    t.linear = i;
    t.idx = make_uint3(i % blockDim.x, (i / blockDim.x) % blockDim.y,
                       i / (blockDim.x * blockDim.y));
    make_context(&s.fibers[i].ctx, s.fibers[i].stack, kStackBytes, fiber_main);
  }
  poison_shared();
  auto ready = [&](int i) { return i < n && s.threads[i].state == State::kReady; };
  for (;;) {
    bool ran = false;
    switch (s.schedule) {
      case Schedule::kRoundRobin:
        for (int i = 0; i < n; ++i)
          if (ready(i)) resume(i), ran = true;
        break;
      case Schedule::kWarpsForward:
      case Schedule::kWarpsBackward: {
        const bool fwd = s.schedule == Schedule::kWarpsForward;
        for (int wi = 0; wi < warps; ++wi) {
          const int w = fwd ? wi : warps - 1 - wi;
          for (bool any = true; any;) {
            any = false;
            for (int li = 0; li < 32; ++li) {
              const int i = w * 32 + (fwd ? li : 31 - li);
              if (ready(i)) resume(i), any = ran = true;
            }
          }
        }
        break;
      }
    }
    if (ran) continue;
    int exited = 0, at_barrier = 0, first_barrier = -1;
    for (int i = 0; i < n; ++i) {
      if (s.threads[i].state == State::kExited) ++exited;
      if (s.threads[i].state == State::kBarrier) {
        ++at_barrier;
        if (first_barrier < 0) first_barrier = i;
      }
    }
    if (exited == n) return;
    if (at_barrier + exited == n && exited == 0) {
      const Thread& a = s.threads[first_barrier];
      for (int i = 0; i < n; ++i) {
        const Thread& b = s.threads[i];
        if (b.bar_line != a.bar_line || std::strcmp(b.bar_file, a.bar_file) != 0)
          throw Error(where(s, i) + "waits at " + barrier_site(b) + " while thread " +
                      std::to_string(first_barrier) + " waits at " + barrier_site(a) +
                      " (divergent barriers)");
      }
      for (Thread& t : s.threads) t.state = State::kReady;
      continue;
    }
    // Nothing can run and the barrier cannot complete.
    std::ostringstream os;
    os << "deadlock: " << exited << " threads exited, " << at_barrier << " at a barrier";
    for (int i = 0; i < n; ++i)
      if (s.threads[i].state == State::kWarpOp) {
        os << ", thread " << i << " waits in " << op_name(s.threads[i].op) << " with mask "
           << hex(s.threads[i].mask);
        break;
      }
    throw Error(where(s, -1) + os.str());
  }
}

}  // namespace

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::kRoundRobin: return "round-robin";
    case Schedule::kWarpsForward: return "warps-forward";
    case Schedule::kWarpsBackward: return "warps-backward";
  }
  return "?";
}
void set_schedule(Schedule s) { sim().schedule = s; }
Schedule schedule() { return sim().schedule; }
void set_sm_count(int count) { sim().sm_count = count; }
int64_t launches_run() { return sim().launches; }

void launch_kernel(const char* name, const void* func, dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, const std::function<void()>& body) {
  (void)stream;  // launches run synchronously, in issue order
  Sim& s = sim();
  if (s.current >= 0)
    throw std::logic_error("cuda_sim: a kernel launched another kernel (not modelled)");
  const uint64_t threads = static_cast<uint64_t>(block.x) * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0 ||
      threads > kMaxThreadsPerBlock || block.x > 1024 || block.y > 1024 || block.z > 64 ||
      grid.x > kMaxGridX || grid.y > kMaxGridYZ || grid.z > kMaxGridYZ) {
    s.last_error = cudaErrorInvalidConfiguration;
    return;
  }
  const auto attr = s.max_dynamic_smem.find(func);
  const size_t smem_limit = attr == s.max_dynamic_smem.end() ? kDefaultDynamicSmem : attr->second;
  if (smem > smem_limit) {
    s.last_error = cudaErrorInvalidValue;
    return;
  }
  ++s.launches;
  grow_fibers(threads);
  s.kernel = name;
  s.body = &body;
  s.threads.assign(threads, Thread{});
  s.dyn_bytes = smem;
  s.dyn_smem = std::malloc(smem ? smem : 1);  // exactly the launch's bytes: ASan sees overruns
  gridDim = grid;
  blockDim = block;
  struct Cleanup {
    Sim& s;
    ~Cleanup() {
#if defined(CUDA_SIM_ASAN)
      for (size_t i = 0; i < s.threads.size(); ++i)
        if (s.threads[i].state != State::kExited)
          __asan_unpoison_memory_region(s.fibers[i].stack, kStackBytes);
#endif
      std::free(s.dyn_smem);
      s.dyn_smem = nullptr;
      s.dyn_bytes = 0;
      s.body = nullptr;
      s.current = -1;
    }
  } cleanup{s};
  const uint64_t blocks = static_cast<uint64_t>(grid.x) * grid.y * grid.z;
  const bool reverse = s.schedule == Schedule::kWarpsBackward;
  for (uint64_t bi = 0; bi < blocks; ++bi) {
    const uint64_t b = reverse ? blocks - 1 - bi : bi;
    blockIdx = make_uint3(static_cast<unsigned>(b % grid.x),
                          static_cast<unsigned>((b / grid.x) % grid.y),
                          static_cast<unsigned>(b / (static_cast<uint64_t>(grid.x) * grid.y)));
    run_block();
  }
}

void syncthreads(const char* file, int line) {
  Sim& s = sim();
  if (s.current < 0) throw std::logic_error("cuda_sim: __syncthreads() outside a kernel");
  Thread& t = s.threads[s.current];
  const int n = static_cast<int>(s.threads.size());
  for (int i = 0; i < n; ++i)
    if (s.threads[i].state == State::kExited)
      fail(std::string("reaches __syncthreads at ") + file + ":" + std::to_string(line) +
           " after thread " + std::to_string(i) +
           " returned: a barrier every live thread must reach");
  const int warp = t.linear >> 5, lane = t.linear & 31;
  for (int l = 0; l < 32 && warp * 32 + l < n; ++l) {
    const Thread& o = s.threads[warp * 32 + l];
    if (o.state == State::kWarpOp && ((o.mask >> lane) & 1u))
      fail(std::string("reaches __syncthreads at ") + file + ":" + std::to_string(line) +
           " while lane " + std::to_string(l) + " waits for it in " + op_name(o.op) +
           " with mask " + hex(o.mask) + " (lanes of one mask at different intrinsics)");
  }
  t.state = State::kBarrier;
  t.bar_file = file;
  t.bar_line = line;
  to_scheduler(false);
}

uint64_t warp_op(WarpOpKind kind, unsigned mask, uint64_t value, int arg, int width) {
  Sim& s = sim();
  if (s.current < 0) throw std::logic_error("cuda_sim: a warp intrinsic outside a kernel");
  Thread& t = s.threads[s.current];
  const int n = static_cast<int>(s.threads.size());
  const int warp = t.linear >> 5, lane = t.linear & 31;
  const std::string name = op_name(kind);
  if (width < 1 || width > 32 || (width & (width - 1)) != 0)
    fail(name + " with width " + std::to_string(width) + ": not a power of two in [1, 32]");
  if (!((mask >> lane) & 1u))
    fail(name + " with mask " + hex(mask) + ", which does not name the calling lane");
  for (int l = 0; l < 32; ++l) {
    const int i = warp * 32 + l;
    const bool in_mask = (mask >> l) & 1u;
    if (in_mask && i >= n)
      fail(name + " with mask " + hex(mask) + " names lane " + std::to_string(l) +
           ", which the block (" + std::to_string(n) + " threads) does not have");
    if (i >= n || i == t.linear) continue;
    const Thread& o = s.threads[i];
    if (in_mask && o.state == State::kExited)
      fail(name + " with mask " + hex(mask) + " names lane " + std::to_string(l) +
           ", which has exited");
    if (in_mask && o.state == State::kBarrier)
      fail(name + " with mask " + hex(mask) + " while lane " + std::to_string(l) +
           " of the mask waits at " + barrier_site(o) +
           " (lanes of one mask at different intrinsics)");
    if (o.state == State::kWarpOp && (in_mask || ((o.mask >> lane) & 1u)) &&
        (o.op != kind || o.mask != mask || o.width != width))
      fail(name + " with mask " + hex(mask) + " (width " + std::to_string(width) +
           ") while lane " + std::to_string(l) + " waits in " + op_name(o.op) + " with mask " +
           hex(o.mask) + " (width " + std::to_string(o.width) +
           "): lanes of one mask at different intrinsics");
  }
  t.state = State::kWarpOp;
  t.op = kind;
  t.mask = mask;
  t.width = width;
  t.arg = arg;
  t.value = value;
  bool complete = true;
  for (int l = 0; l < 32; ++l)
    if (((mask >> l) & 1u) && s.threads[warp * 32 + l].state != State::kWarpOp) complete = false;
  if (complete) complete_warp_op(warp, mask);
  to_scheduler(false);
  return s.threads[s.current].result;
}

void* dynamic_shared() {
  Sim& s = sim();
  if (s.current < 0) throw std::logic_error("cuda_sim: dynamic shared memory outside a kernel");
  return s.dyn_smem;
}

}  // namespace cuda_sim

// ---- runtime API (cuda_sim::api; the names are macros for the qualified ones) ---------------
#undef cudaGetLastError
#undef cudaPeekAtLastError
#undef cudaGetErrorName
#undef cudaGetErrorString
#undef cudaGetDevice
#undef cudaGetDeviceCount
#undef cudaDeviceGetAttribute
#undef cudaFuncSetAttribute
#undef cudaMalloc
#undef cudaFree
#undef cudaMemcpy
#undef cudaMemset
#undef cudaMemsetAsync
#undef cudaDeviceSynchronize
#undef cudaStreamSynchronize

namespace cuda_sim::api {
namespace {
cudaError_t record(cudaError_t e) {
  if (e != cudaSuccess) sim().last_error = e;
  return e;
}
}  // namespace

cudaError_t cudaGetLastError() {
  const cudaError_t e = sim().last_error;
  sim().last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return sim().last_error; }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    default: return "cudaErrorUnknown";
  }
}
const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    default: return "unknown error (cuda_sim)";
  }
}

cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return record(cudaErrorInvalidValue);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = sim().sm_count; return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock: *value = kMaxThreadsPerBlock; return cudaSuccess;
    case cudaDevAttrWarpSize: *value = 32; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = kDefaultDynamicSmem; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = kMaxDynamicSmemOptin; return cudaSuccess;
    default: return record(cudaErrorInvalidValue);
  }
}
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return record(cudaErrorInvalidValue);
  if (value < 0 || value > kMaxDynamicSmemOptin) return record(cudaErrorInvalidValue);
  sim().max_dynamic_smem[func] = value;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t size) {
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  // 256-byte aligned like cudaMalloc, and exactly `size` bytes so that ASan sees overruns.
  if (posix_memalign(ptr, 256, size) != 0) return record(cudaErrorMemoryAllocation);
  return cudaSuccess;
}
cudaError_t cudaFree(void* ptr) {
  std::free(ptr);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  (void)kind;
  if (count) std::memcpy(dst, src, count);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  if (count) std::memset(ptr, value, count);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  (void)stream;
  return cudaMemset(ptr, value, count);
}
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  (void)stream;
  return cudaSuccess;
}

}  // namespace cuda_sim::api
