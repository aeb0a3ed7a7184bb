// The stand-in accelerator: a CPU-backed out-of-tree device registered through PrivateUse1 as
// "standin". What it registers (all from static initialisers, in this order):
//   - the backend name, the allocator (host memory, 64-byte aligned, counted per device),
//     the device guard (thread-local current index, no-op streams and events), the hooks
//     (generators, pinned memory, storage resize, device of a pointer);
//   - explicit kernels for what must not run through a CPU kernel (factories, views of the
//     storage, copies between devices, set_/resize_, ...);
//   - a boxed fallback for every other op: the standin arguments are aliased as CPU tensors
//     (same memory, no copy), devices are checked like a CUDA kernel would, the op's CPU kernel
//     runs, and CPU results are re-wrapped as standin tensors without a copy;
//   - every op with a CompositeExplicitAutograd kernel and no standin kernel is routed to the
//     fallback too, so it runs the CPU kernel instead of the composite (bit-identity with CPU);
//   - the scaled-dot-product-attention choice stub and dropout follow the CPU path.
// LOOM_STANDIN_VERBOSE=1 prints what was registered.
#include "standin_device.h"
#include "standin_internal.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/Resize.h>
#include <ATen/native/ResizeCommon.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace loom::standin {
namespace {

constexpr c10::DeviceType kDevice = c10::DeviceType::PrivateUse1;
constexpr int kMaxDevices = 64;
constexpr size_t kAlign = 64;   // also the size of the header in front of each block

bool verbose() {
  static const bool v = [] {
    const char* e = std::getenv("LOOM_STANDIN_VERBOSE");
    return e != nullptr && std::string(e) == "1";
  }();
  return v;
}

int read_device_count() {
  const char* e = std::getenv("LOOM_STANDIN_DEVICE_COUNT");
  if (e == nullptr || *e == '\0') return 16;
  char* end = nullptr;
  long n = std::strtol(e, &end, 10);
  if (*end != '\0' || n < 1 || n > kMaxDevices) {
    std::fprintf(stderr, "standin: LOOM_STANDIN_DEVICE_COUNT=%s is not in 1..%d; using 16\n", e,
                 kMaxDevices);
    return 16;
  }
  return static_cast<int>(n);
}

thread_local c10::DeviceIndex tl_device = 0;

void check_index(int index) {
  TORCH_CHECK(index >= 0 && index < device_count(), "standin: device index ", index,
              " is out of range: there are ", device_count(),
              " standin devices (LOOM_STANDIN_DEVICE_COUNT)");
}

c10::DeviceIndex index_of(const std::optional<c10::Device>& device) {
  if (!device.has_value() || !device->has_index()) return tl_device;
  check_index(device->index());
  return device->index();
}

// ---------------------------------------------------------------------------------------------
// Memory: counters per device and the address ranges of device memory (for getDeviceFromPtr).

struct Counter {
  std::atomic<int64_t> current{0};
  std::atomic<int64_t> peak{0};
  std::atomic<int64_t> allocated{0};   // bytes ever allocated, since load or the last reset
  std::atomic<int64_t> freed{0};
  std::atomic<int64_t> blocks{0};      // live allocations
  std::atomic<int64_t> blocks_peak{0};
};
std::array<Counter, kMaxDevices> g_counters;

// Times the host waited for the device, as it would on CUDA: a scalar read (.item()), a copy to
// host memory, a blocking copy from host memory (non_blocking false or a pageable source) and a
// synchronize call. The device itself never queues work, so these are counted, not timed.
std::atomic<int64_t> g_host_waits{0};

void count_host_wait() { g_host_waits.fetch_add(1, std::memory_order_relaxed); }

void raise_peak(std::atomic<int64_t>& peak, int64_t now) {
  int64_t p = peak.load();
  while (now > p && !peak.compare_exchange_weak(p, now)) {
  }
}

// Device memory capacity in bytes (LOOM_STANDIN_MEMORY_MIB; 0 = unlimited): lets CPU
// machines test what happens when a run does not fit its device (out-of-memory handling,
// micro-batch searches).
int64_t capacity_bytes() {
  static const int64_t cap = [] {
    const char* e = std::getenv("LOOM_STANDIN_MEMORY_MIB");
    if (e == nullptr || *e == '\0') return int64_t(0);
    char* end = nullptr;
    const long long mib = std::strtoll(e, &end, 10);
    if (*end != '\0' || mib < 0) {
      std::fprintf(stderr, "standin: LOOM_STANDIN_MEMORY_MIB=%s is not a number of MiB; unlimited\n", e);
      return int64_t(0);
    }
    return int64_t(mib) << 20;
  }();
  return cap;
}

// Refuses an allocation of n bytes that would exceed the capacity, as CUDA's allocator does.
void check_capacity(int device, size_t n) {
  const int64_t cap = capacity_bytes();
  if (cap == 0) return;
  const int64_t used = g_counters[device].current.load();
  TORCH_CHECK_WITH(OutOfMemoryError, used + static_cast<int64_t>(n) <= cap,
                   "standin: out of memory: tried to allocate ", n >> 20, " MiB on standin:", device,
                   " with ", used >> 20, " MiB of ", cap >> 20,
                   " MiB in use (LOOM_STANDIN_MEMORY_MIB)");
}

// LOOM_STANDIN_TRACE_PEAK=N (bytes): every allocation of at least N bytes that raises a device's
// peak is printed to stderr with the new peak (a diagnostic for memory accounting; unset: off).
int64_t trace_peak_bytes() {
  static const int64_t n = [] {
    const char* e = std::getenv("LOOM_STANDIN_TRACE_PEAK");
    return e == nullptr || *e == '\0' ? int64_t(-1) : int64_t(std::strtoll(e, nullptr, 10));
  }();
  return n;
}

void account(int device, int64_t delta) {
  Counter& c = g_counters[device];
  const int64_t now = c.current.fetch_add(delta) + delta;
  const int64_t blocks = c.blocks.fetch_add(delta >= 0 ? 1 : -1) + (delta >= 0 ? 1 : -1);
  if (delta >= 0) {
    c.allocated.fetch_add(delta);
    if (const int64_t trace = trace_peak_bytes(); trace >= 0 && delta >= trace && now > c.peak.load())
      std::fprintf(stderr, "standin:%d peak %lld after +%lld\n", device, static_cast<long long>(now),
                   static_cast<long long>(delta));
    raise_peak(c.peak, now);
    raise_peak(c.blocks_peak, blocks);
  } else {
    c.freed.fetch_add(-delta);
  }
}

struct Ranges {
  std::mutex mutex;
  std::map<uintptr_t, std::pair<size_t, int>> map;   // start -> (bytes, device or -1)

  void add(const void* p, size_t n, int device) {
    std::lock_guard<std::mutex> lock(mutex);
    map[reinterpret_cast<uintptr_t>(p)] = {n, device};
  }
  void remove(const void* p) {
    std::lock_guard<std::mutex> lock(mutex);
    map.erase(reinterpret_cast<uintptr_t>(p));
  }
  // The device of the block holding p, or -2 when none does.
  int find(const void* p) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mutex);
    auto it = map.upper_bound(a);
    if (it == map.begin()) return -2;
    --it;
    return a < it->first + std::max<size_t>(it->second.first, 1) ? it->second.second : -2;
  }
};
Ranges& device_ranges() {
  static auto* r = new Ranges();   // leaked: frees may run during static destruction
  return *r;
}
Ranges& pinned_ranges() {
  static auto* r = new Ranges();
  return *r;
}

size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

struct BlockHeader {
  size_t bytes;
  int device;
};

void free_block(void* ctx) {
  auto* h = static_cast<BlockHeader*>(ctx);
  device_ranges().remove(reinterpret_cast<char*>(h) + kAlign);
  account(h->device, -static_cast<int64_t>(h->bytes));
  std::free(h);
}

c10::DataPtr allocate_on(int device, size_t n) {
  if (n == 0) return c10::DataPtr(nullptr, c10::Device(kDevice, device));
  check_capacity(device, n);
  void* base = std::aligned_alloc(kAlign, kAlign + round_up(n));
  TORCH_CHECK_WITH(OutOfMemoryError, base != nullptr, "standin: out of host memory allocating ",
                   n, " bytes on standin:", device);
  auto* h = new (base) BlockHeader{n, device};
  void* data = static_cast<char*>(base) + kAlign;
  device_ranges().add(data, n, device);
  account(device, static_cast<int64_t>(n));
  return c10::DataPtr(data, h, &free_block, c10::Device(kDevice, device));
}

// Memory made elsewhere (a CPU kernel's result) that now belongs to a standin storage.
struct Adopted {
  c10::Storage cpu;
  size_t bytes;
  int device;
  void* data;
};

void free_adopted(void* ctx) {
  auto* a = static_cast<Adopted*>(ctx);
  device_ranges().remove(a->data);
  account(a->device, -static_cast<int64_t>(a->bytes));
  delete a;
}

// The device allocator; a c10::DeviceAllocator so that code reading a device's memory statistics
// (getDeviceStats, resetPeakStats, as for CUDA's caching allocator) works on the stand-in too.
// Nothing is cached: reserved = allocated.
struct DeviceAllocator final : c10::DeviceAllocator {
  int device = -1;   // -1: the current device
  c10::DataPtr allocate(size_t n) override {
    return allocate_on(device >= 0 ? device : tl_device, n);
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override {}
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex d) override {
    check_index(d);
    const Counter& c = g_counters[d];
    c10::CachingAllocator::Stat bytes;
    bytes.current = c.current.load();
    bytes.peak = c.peak.load();
    bytes.allocated = c.allocated.load();
    bytes.freed = c.freed.load();
    c10::CachingAllocator::Stat count;
    count.current = c.blocks.load();
    count.peak = c.blocks_peak.load();
    c10::CachingDeviceAllocator::DeviceStats stats;
    const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    stats.allocated_bytes[all] = stats.reserved_bytes[all] = stats.active_bytes[all] =
        stats.requested_bytes[all] = bytes;
    stats.allocation[all] = stats.segment[all] = stats.active[all] = count;
    return stats;
  }
  void resetAccumulatedStats(c10::DeviceIndex d) override {
    check_index(d);
    g_counters[d].allocated.store(0);
    g_counters[d].freed.store(0);
  }
  void resetPeakStats(c10::DeviceIndex d) override {
    check_index(d);
    g_counters[d].peak.store(g_counters[d].current.load());
    g_counters[d].blocks_peak.store(g_counters[d].blocks.load());
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex d) override {
    check_index(d);   // the host's memory: free (available) and total, in bytes
    const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return {static_cast<size_t>(sysconf(_SC_AVPHYS_PAGES)) * page,
            static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * page};
  }
};

std::array<DeviceAllocator, kMaxDevices>& device_allocators() {
  static auto* a = [] {
    auto* arr = new std::array<DeviceAllocator, kMaxDevices>();
    for (int i = 0; i < kMaxDevices; ++i) (*arr)[i].device = i;
    return arr;
  }();
  return *a;
}
DeviceAllocator g_current_allocator;   // registered with c10::SetAllocator

c10::Allocator* allocator_for(int device) { return &device_allocators()[device]; }

// A standin storage over the memory of a CPU storage (kept alive), no copy.
c10::Storage adopt_cpu_storage(const c10::Storage& cpu, int device) {
  const size_t n = cpu.nbytes();
  if (n == 0 || cpu.data() == nullptr) {
    return c10::Storage(c10::Storage::use_byte_size_t(), 0, allocator_for(device), true);
  }
  check_capacity(device, n);
  void* data = cpu.mutable_data();
  auto* a = new Adopted{cpu, n, device, data};
  device_ranges().add(data, n, device);
  account(device, static_cast<int64_t>(n));
  c10::DataPtr dp(data, a, &free_adopted, c10::Device(kDevice, device));
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(),
                                                            n, std::move(dp),
                                                            allocator_for(device), true));
}

// Reallocates a standin storage to exactly n bytes, keeping min(old, n) bytes of contents.
void realloc_storage(const c10::Storage& storage, size_t n) {
  TORCH_CHECK(storage.resizable(), "Trying to resize storage that is not resizable");
  const int device = storage.device().has_index() ? storage.device().index() : tl_device;
  c10::DataPtr fresh = allocate_on(device, n);
  const size_t keep = std::min(n, storage.nbytes());
  if (keep > 0 && storage.data() != nullptr) std::memcpy(fresh.get(), storage.data(), keep);
  storage.set_data_ptr_noswap(std::move(fresh));
  storage.set_nbytes(n);
}

void free_pinned(void* p) {
  pinned_ranges().remove(p);
  std::free(p);
}

struct PinnedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return c10::DataPtr(nullptr, c10::Device(c10::kCPU));
    void* p = std::aligned_alloc(kAlign, round_up(n));
    TORCH_CHECK_WITH(OutOfMemoryError, p != nullptr, "standin: out of host memory pinning ", n,
                     " bytes");
    pinned_ranges().add(p, n, -1);
    return c10::DataPtr(p, p, &free_pinned, c10::Device(c10::kCPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};
PinnedAllocator g_pinned_allocator;

// ---------------------------------------------------------------------------------------------
// Aliases: CPU tensors over standin memory.

void release_storage_ref(void* ctx) { delete static_cast<c10::Storage*>(ctx); }

c10::Storage alias_storage(const c10::Storage& st) {
  void* data = st.nbytes() > 0 ? st.mutable_data() : nullptr;
  c10::DataPtr dp(data, new c10::Storage(st), &release_storage_ref, c10::Device(c10::kCPU));
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), st.nbytes(), std::move(dp), c10::GetCPUAllocator(),
      st.resizable()));
}

at::Tensor make_like(c10::Storage storage, c10::DispatchKey key, const at::Tensor& like) {
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(key), like.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(),
                                                 like.storage_offset());
  if (like.is_conj()) t._set_conj(true);
  if (like.is_neg()) t._set_neg(true);
  return t;
}

// ---------------------------------------------------------------------------------------------
// The device guard.

struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kDevice; }
  c10::Device exchangeDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kDevice, "standin guard got device ", d);
    const c10::Device old = getDevice();
    if (d.has_index() && d.index() != old.index()) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kDevice, tl_device); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kDevice, "standin guard got device ", d);
    if (d.has_index()) {
      check_index(d.index());
      tl_device = d.index();
    }
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.has_index()) tl_device = d.index();
  }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream getDefaultStream(c10::Device d) const override { return getStream(d); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override { return getStream(d); }
  c10::Stream getNewStream(c10::Device d, int) const override { return getStream(d); }
  c10::Stream exchangeStream(c10::Stream s) const override { return getStream(s.device()); }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  void record(void**, const c10::Stream&, const c10::DeviceIndex,
              const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(device_count());
  }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override { count_host_wait(); }
  void synchronizeEvent(void*) const override { count_host_wait(); }
  void synchronizeDevice(const c10::DeviceIndex) const override { count_host_wait(); }
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
  double elapsedTime(void*, void*, const c10::DeviceIndex) const override { return 0.0; }
};

// ---------------------------------------------------------------------------------------------
// Generators: a standin generator owns a CPU generator; kernels draw from that one.

struct Generator final : c10::GeneratorImpl {
  Generator(c10::DeviceIndex index, at::Generator cpu)
      : c10::GeneratorImpl(c10::Device(kDevice, index),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        cpu_(std::move(cpu)) {}

  static c10::DeviceType device_type() { return kDevice; }
  const at::Generator& cpu() const { return cpu_; }

  void set_current_seed(uint64_t seed) override {
    std::lock_guard<std::mutex> lock(cpu_mutex());
    cpu_.set_current_seed(seed);
  }
  void set_offset(uint64_t offset) override {
    std::lock_guard<std::mutex> lock(cpu_mutex());
    cpu_.set_offset(offset);
  }
  uint64_t get_offset() const override { return cpu_.get_offset(); }
  uint64_t current_seed() const override { return cpu_.current_seed(); }
  uint64_t seed() override {
    std::lock_guard<std::mutex> lock(cpu_mutex());
    return cpu_.seed();
  }
  void set_state(const c10::TensorImpl& state) override {
    std::lock_guard<std::mutex> lock(cpu_mutex());
    cpu_.unsafeGetGeneratorImpl()->set_state(state);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    std::lock_guard<std::mutex> lock(cpu_mutex());
    return cpu_.unsafeGetGeneratorImpl()->get_state();
  }

 private:
  std::mutex& cpu_mutex() const { return cpu_.unsafeGetGeneratorImpl()->mutex_; }
  Generator* clone_impl() const override { return new Generator(device_.index(), cpu_.clone()); }
  at::Generator cpu_;
};

at::Generator new_generator(c10::DeviceIndex index, uint64_t seed) {
  return at::make_generator<Generator>(index, at::make_generator<at::CPUGeneratorImpl>(seed));
}

// ---------------------------------------------------------------------------------------------
// The hooks.

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  void init() const override {}
  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(device_count());
  }
  void setCurrentDevice(c10::DeviceIndex d) const override {
    check_index(d);
    tl_device = d;
  }
  c10::DeviceIndex getCurrentDevice() const override { return tl_device; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    const c10::DeviceIndex old = tl_device;
    setCurrentDevice(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override {
    return exchangeDevice(d);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    static std::mutex mutex;
    static std::array<at::Generator*, kMaxDevices> generators{};
    const c10::DeviceIndex i = index < 0 ? tl_device : index;
    check_index(i);
    std::lock_guard<std::mutex> lock(mutex);
    if (generators[i] == nullptr) {
      generators[i] = new at::Generator(new_generator(i, c10::default_rng_seed_val));
    }
    return *generators[i];
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    const c10::DeviceIndex i = index < 0 ? tl_device : index;
    check_index(i);
    return new_generator(i, c10::default_rng_seed_val);
  }
  at::Device getDeviceFromPtr(void* data) const override {
    const int d = device_ranges().find(data);
    TORCH_CHECK(d >= 0, "standin: pointer ", data, " is not in memory of a standin device");
    return c10::Device(kDevice, static_cast<c10::DeviceIndex>(d));
  }
  bool isPinnedPtr(const void* data) const override {
    return pinned_ranges().find(data) != -2;
  }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &g_pinned_allocator; }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t n) const override {
    realloc_storage(storage, n);
  }
};

// ---------------------------------------------------------------------------------------------
// The boxed fallback.

std::string op_name(const c10::OperatorHandle& op) {
  const auto& n = op.operator_name();
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

[[noreturn]] void refuse(const c10::OperatorHandle& op, const char* what, const c10::Device& got,
                         const c10::Device& expected, const std::string& arg) {
  TORCH_CHECK(false, "standin: ", op_name(op), " got ", what, " on ", device_name(got),
              ", expected ", device_name(expected),
              " (a CUDA kernel would refuse it too) [argument '", arg, "']");
}

// Ops whose CUDA kernels take index tensors on the host (they copy them to the device).
bool takes_host_indices(const c10::OperatorHandle& op) {
  const std::string& n = op.operator_name().name;
  return n == "aten::index" || n == "aten::index_put_" || n == "aten::index_put" ||
         n == "aten::_index_put_impl_" || n == "aten::_unsafe_index" ||
         n == "aten::_unsafe_index_put";
}

// Whether the op may write the argument (Tensor(a!), or a list of Tensor(a!)).
bool writes(const c10::Argument& a) {
  const c10::AliasInfo* info = a.alias_info();
  if (info == nullptr) return false;
  if (info->isWrite()) return true;
  for (const auto& c : info->containedTypes()) {
    if (c.isWrite()) return true;
  }
  return false;
}

class Call {
 public:
  explicit Call(const c10::OperatorHandle& op) : op_(op) {}

  // Checks the devices of the arguments and finds the device the op runs on.
  void check(const torch::jit::Stack& stack, size_t begin) {
    const auto& args = op_.schema().arguments();
    // The device: the first standin tensor's, else a standin Device argument's, else a
    // standin generator's.
    std::optional<c10::Device> from_device_arg, from_generator;
    for (size_t i = 0; i < args.size(); ++i) {
      const c10::IValue& v = stack[begin + i];
      if (v.isTensor()) {
        note(v.toTensor());
      } else if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorList().vec()) note(t);
      } else if (v.isOptionalTensorList()) {
        for (const auto& t : v.toOptionalTensorList().vec())
          if (t.has_value()) note(*t);
      } else if (v.isDevice()) {
        const c10::Device d = v.toDevice();
        if (d.type() == kDevice && !from_device_arg) {
          from_device_arg = c10::Device(kDevice, index_of(d));
        }
        out_device_ = d.type() == kDevice ? c10::Device(kDevice, index_of(d)) : d;
      } else if (v.isGenerator()) {
        const at::Generator& g = v.toGenerator();
        if (g.defined() && g.device().type() == kDevice && !from_generator) {
          from_generator = g.device();
        }
      }
    }
    if (!device_) device_ = from_device_arg ? from_device_arg : from_generator;
    if (!device_) return;   // nothing on the device: the CPU kernel gets the arguments as they are
    if (!out_device_) out_device_ = device_;

    const bool host_indices_ok = takes_host_indices(op_);
    auto check_tensor = [&](const at::Tensor& t, const std::string& name, bool index_list) {
      if (!t.defined()) return;
      const c10::Device d = t.device();
      if (d.type() == kDevice) {
        if (d.index() != device_->index()) refuse(op_, "an argument", d, *device_, name);
      } else if (d.type() == c10::kCPU) {
        host_storages_.push_back(t.storage().unsafeGetStorageImpl());
        // CUDA accepts 0-dim CPU tensors as scalars in elementwise (TensorIterator) kernels
        // only, the ops tagged pointwise; anywhere else a host tensor is refused.
        if (t.dim() == 0 && op_.hasTag(at::Tag::pointwise)) return;
        if (index_list && host_indices_ok) return;
        refuse(op_, "an argument", d, *device_, name);
      } else {
        refuse(op_, "an argument", d, *device_, name);
      }
    };
    for (size_t i = 0; i < args.size(); ++i) {
      const c10::IValue& v = stack[begin + i];
      const std::string& name = args[i].name();
      if (v.isTensor()) {
        check_tensor(v.toTensor(), name, false);
      } else if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorList().vec()) check_tensor(t, name, false);
      } else if (v.isOptionalTensorList()) {
        for (const auto& t : v.toOptionalTensorList().vec())
          if (t.has_value()) check_tensor(*t, name, true);
      } else if (v.isGenerator()) {
        const at::Generator& g = v.toGenerator();
        if (g.defined() && g.device().type() != kDevice) {
          refuse(op_, "a generator", g.device(), *device_, name);
        }
      }
    }
  }

  // Replaces the standin arguments on the stack by CPU aliases, standin generators by their CPU
  // generators and standin Device arguments by the CPU.
  void to_cpu(torch::jit::Stack& stack, size_t begin) {
    const auto& args = op_.schema().arguments();
    for (size_t i = 0; i < args.size(); ++i) {
      c10::IValue& v = stack[begin + i];
      const bool write = writes(args[i]);
      if (v.isTensor()) {
        const at::Tensor& t = v.toTensor();
        if (t.defined() && t.device().type() == kDevice) v = alias(t, write);
      } else if (v.isTensorList()) {
        c10::List<at::Tensor> list = v.toTensorList();
        bool any = false;
        for (const at::Tensor& t : list.vec()) any |= t.defined() && t.device().type() == kDevice;
        if (!any) continue;
        c10::List<at::Tensor> cpu;
        cpu.reserve(list.size());
        for (const at::Tensor& t : list.vec()) {
          cpu.push_back(t.defined() && t.device().type() == kDevice ? alias(t, write) : t);
        }
        v = std::move(cpu);
      } else if (v.isOptionalTensorList()) {
        c10::List<std::optional<at::Tensor>> list = v.toOptionalTensorList();
        c10::List<std::optional<at::Tensor>> cpu;
        cpu.reserve(list.size());
        for (const auto& t : list.vec()) {
          if (t.has_value() && t->defined() && t->device().type() == kDevice) {
            cpu.push_back(alias(*t, write));
          } else {
            cpu.push_back(t);
          }
        }
        v = std::move(cpu);
      } else if (v.isGenerator()) {
        const at::Generator& g = v.toGenerator();
        if (g.defined() && g.device().type() == kDevice) {
          auto* s = dynamic_cast<Generator*>(g.unsafeGetGeneratorImpl());
          TORCH_CHECK(s != nullptr, "standin: ", op_name(op_),
                      " got a PrivateUse1 generator that the stand-in did not make");
          v = s->cpu();
        }
      } else if (v.isDevice()) {
        if (v.toDevice().type() == kDevice) v = c10::Device(c10::kCPU);
      }
    }
  }

  // After the CPU kernel: carries storage and metadata changes of written arguments back to the
  // standin tensors and turns CPU results into standin tensors.
  void from_cpu(torch::jit::Stack& stack, size_t num_returns) {
    for (auto& s : storages_) {
      c10::StorageImpl* a = s.alias.unsafeGetStorageImpl();
      if (a->data_ptr().get() != s.data || a->nbytes() != s.nbytes) {
        // The CPU kernel resized the storage: the standin storage takes the new memory.
        c10::Storage grown = adopt_cpu_storage(s.alias, device_->index());
        s.original.set_data_ptr_noswap(std::move(grown.unsafeGetStorageImpl()->mutable_data_ptr()));
        s.original.set_nbytes(grown.nbytes());
      }
    }
    for (auto& t : tensors_) {
      if (!t.write) continue;
      c10::TensorImpl* a = t.alias.unsafeGetTensorImpl();
      c10::TensorImpl* o = t.original.unsafeGetTensorImpl();
      c10::StorageImpl* as = a->unsafe_storage().unsafeGetStorageImpl();
      if (as != t.alias_storage) {   // set_ on the alias
        o->set_storage_keep_dtype(standin_storage_for(a->unsafe_storage()));
      }
      if (a->sizes() != o->sizes() || a->strides() != o->strides() ||
          a->storage_offset() != o->storage_offset()) {
        o->set_sizes_and_strides(a->sizes(), a->strides(), a->storage_offset());
      }
    }
    const size_t begin = stack.size() - num_returns;
    for (size_t i = begin; i < stack.size(); ++i) {
      c10::IValue& v = stack[i];
      if (v.isTensor()) {
        v = result(v.toTensor());
      } else if (v.isTensorList()) {
        c10::List<at::Tensor> list = v.toTensorList();
        c10::List<at::Tensor> out;
        out.reserve(list.size());
        for (const at::Tensor& t : list.vec()) out.push_back(result(t));
        v = std::move(out);
      } else if (v.isOptionalTensorList()) {
        c10::List<std::optional<at::Tensor>> list = v.toOptionalTensorList();
        c10::List<std::optional<at::Tensor>> out;
        out.reserve(list.size());
        for (const auto& t : list.vec()) {
          out.push_back(t.has_value() ? std::optional<at::Tensor>(result(*t)) : t);
        }
        v = std::move(out);
      }
    }
  }

  const std::optional<c10::Device>& device() const { return device_; }

 private:
  struct StorageAlias {
    c10::StorageImpl* key;
    c10::Storage original;
    c10::Storage alias;
    void* data;
    size_t nbytes;
  };
  struct TensorAlias {
    c10::TensorImpl* key;
    at::Tensor original;
    at::Tensor alias;
    c10::StorageImpl* alias_storage;
    bool write;
  };

  void note(const at::Tensor& t) {
    if (!device_ && t.defined() && t.device().type() == kDevice) device_ = t.device();
  }

  at::Tensor alias(const at::Tensor& t, bool write) {
    for (auto& a : tensors_) {
      if (a.key == t.unsafeGetTensorImpl()) {
        a.write |= write;
        return a.alias;
      }
    }
    c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
    c10::Storage cpu_storage;
    for (const auto& s : storages_) {
      if (s.key == key) cpu_storage = s.alias;
    }
    if (!cpu_storage) {
      cpu_storage = alias_storage(t.storage());
      storages_.push_back({key, t.storage(), cpu_storage, cpu_storage.unsafeGetStorageImpl()->data_ptr().get(),
                           cpu_storage.nbytes()});
    }
    at::Tensor a = make_like(cpu_storage, c10::DispatchKey::CPU, t);
    tensors_.push_back({t.unsafeGetTensorImpl(), t, a, cpu_storage.unsafeGetStorageImpl(), write});
    return a;
  }

  // The standin storage for a CPU storage a result lives in.
  c10::Storage standin_storage_for(const c10::Storage& cpu) {
    c10::StorageImpl* key = cpu.unsafeGetStorageImpl();
    for (const auto& s : storages_) {
      if (s.alias.unsafeGetStorageImpl() == key) return s.original;   // a view of an input
    }
    for (const auto& r : adopted_) {
      if (r.first == key) return r.second;
    }
    c10::Storage st = adopt_cpu_storage(cpu, out_device_->index());
    adopted_.emplace_back(key, st);
    return st;
  }

  at::Tensor result(const at::Tensor& t) {
    if (!t.defined() || t.device().type() != c10::kCPU) return t;
    for (const auto& a : tensors_) {
      if (a.alias.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return a.original;
    }
    if (!out_device_ || out_device_->type() != kDevice) return t;
    TORCH_CHECK(t.layout() == c10::kStrided, "standin: ", op_name(op_), " returned a ",
                t.layout(), " tensor; the stand-in device holds strided tensors only");
    for (c10::StorageImpl* host : host_storages_) {
      if (t.storage().unsafeGetStorageImpl() == host) {   // a host argument (or a view of one)
        const at::Tensor copy = t.clone(at::MemoryFormat::Contiguous);
        return make_like(adopt_cpu_storage(copy.storage(), out_device_->index()),
                         c10::DispatchKey::PrivateUse1, copy);
      }
    }
    return make_like(standin_storage_for(t.storage()), c10::DispatchKey::PrivateUse1, t);
  }

  const c10::OperatorHandle& op_;
  std::optional<c10::Device> device_;
  std::optional<c10::Device> out_device_;
  std::vector<StorageAlias> storages_;
  std::vector<TensorAlias> tensors_;
  std::vector<std::pair<c10::StorageImpl*, c10::Storage>> adopted_;
  std::vector<c10::StorageImpl*> host_storages_;   // of the host tensors among the arguments
};

struct DeviceScope {
  explicit DeviceScope(const std::optional<c10::Device>& d) : saved(tl_device) {
    if (d && d->type() == kDevice && d->has_index()) tl_device = d->index();
  }
  ~DeviceScope() { tl_device = saved; }
  c10::DeviceIndex saved;
};

void fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const size_t begin = stack->size() - num_args;
  Call call(op);
  call.check(*stack, begin);
  call.to_cpu(*stack, begin);
  DeviceScope scope(call.device());
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  if (call.device()) call.from_cpu(*stack, schema.returns().size());
}

// ---------------------------------------------------------------------------------------------
// Explicit kernels.

// With deterministic algorithms on, the CPU fills new memory (NaN or the largest integer).
bool fill_uninitialized() {
  return at::globalContext().deterministicAlgorithms() &&
         at::globalContext().deterministicFillUninitializedMemory();
}

at::Tensor filled(at::Tensor t) {
  if (C10_UNLIKELY(fill_uninitialized())) at::native::fill_empty_deterministic_(t);
  return t;
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout,
                               std::optional<c10::Device> device, std::optional<bool> pin_memory,
                               std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(layout.value_or(c10::kStrided) == c10::kStrided,
              "standin: only strided tensors, got layout ", *layout);
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned");
  const c10::DeviceIndex d = index_of(device);
  return filled(at::detail::empty_generic(size, allocator_for(d),
                                          c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                          dtype.value_or(c10::get_default_dtype_as_scalartype()),
                                          memory_format));
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  TORCH_CHECK(layout.value_or(c10::kStrided) == c10::kStrided,
              "standin: only strided tensors, got layout ", *layout);
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned");
  const c10::DeviceIndex d = index_of(device);
  return filled(at::detail::empty_strided_generic(
      size, stride, allocator_for(d), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      dtype.value_or(c10::get_default_dtype_as_scalartype())));
}

// Makes the storage of `self` hold at least `bytes` (never shrinks), as CPU's resize does.
void ensure_storage(c10::TensorImpl* self, size_t bytes) {
  if (self->numel() == 0) return;
  const c10::Storage& st = self->unsafe_storage();
  if (bytes > st.nbytes()) realloc_storage(st, bytes);
}

void resize_impl(c10::TensorImpl* self, c10::IntArrayRef size,
                 std::optional<c10::IntArrayRef> stride) {
  if (self->sizes() == size && (!stride || self->strides() == *stride)) return;
  const size_t itemsize = self->dtype().itemsize();
  const int64_t offset = self->storage_offset();
  size_t bytes = 0;
  if (stride) {
    self->set_sizes_and_strides(size, *stride);
    bytes = at::detail::computeStorageNbytes(size, *stride, itemsize, offset);
  } else {
    self->set_sizes_contiguous(size);
    bytes = at::detail::computeStorageNbytesContiguous(size, itemsize, offset);
  }
  ensure_storage(self, bytes);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(!self.has_names(), "standin: resize_ of a named tensor");
  auto* impl = self.unsafeGetTensorImpl();
  const int64_t old_nbytes = static_cast<int64_t>(impl->unsafe_storage().nbytes());
  resize_impl(impl, size, std::nullopt);
  if (memory_format.has_value()) {
    TORCH_CHECK(*memory_format != c10::MemoryFormat::Preserve, "Unsupported memory format ",
                *memory_format);
    impl->empty_tensor_restride(*memory_format);
  }
  if (C10_UNLIKELY(fill_uninitialized())) at::native::fill_resize_deterministic_(self, old_nbytes);
  return self;
}

void check_same_device(const char* op, const at::Tensor& self, const c10::Device& other,
                       const char* what) {
  if (other != self.device()) {
    TORCH_CHECK(false, "standin: ", op, " got ", what, " on ", device_name(other), ", expected ",
                device_name(self.device()), " (a CUDA kernel would refuse it too)");
  }
}

at::Tensor& set_storage_offset(at::Tensor& self, c10::Storage source, int64_t offset,
                               c10::IntArrayRef size, c10::IntArrayRef stride) {
  check_same_device("aten::set_", self, source.device(), "a storage");
  at::native::checkSetStorage(self, source, offset, size, stride);
  self.unsafeGetTensorImpl()->set_storage_offset(offset);
  resize_impl(self.unsafeGetTensorImpl(), size,
              stride.data() != nullptr ? std::optional<c10::IntArrayRef>(stride) : std::nullopt);
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source) {
  const int64_t n = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage_offset(self, std::move(source), 0, {n}, {});
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  check_same_device("aten::set_", self, source.device(), "a tensor");
  if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl()) return self;
  return set_storage_offset(self, source.storage(), source.storage_offset(), source.sizes(),
                            source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage st(c10::Storage::use_byte_size_t(), 0, allocator_for(self.device().index()), true);
  return set_storage_offset(self, std::move(st), 0, {0}, {});
}

at::Tensor& copy_(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  const bool to_host = self.device().type() != kDevice && src.device().type() == kDevice;
  const bool blocking_from_host = self.device().type() == kDevice && src.device().type() != kDevice &&
                                  (!non_blocking || !src.is_pinned());
  if (to_host || blocking_from_host) count_host_wait();
  at::Tensor dst = self.device().type() == kDevice ? alias_as_cpu(self) : self;
  at::Tensor from = src.device().type() == kDevice ? alias_as_cpu(src) : src;
  dst.copy_(from, non_blocking);   // synchronous: non_blocking changes nothing on the host
  return self;
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  at::Tensor out = dst;
  copy_(out, self, non_blocking);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.device().type() == kDevice) {
    resize_(dst, self.sizes(), std::nullopt);
  } else {
    dst.resize_(self.sizes());
  }
  return copy_from(self, dst, false);
}

c10::Scalar local_scalar_dense(const at::Tensor& self) {
  count_host_wait();
  return at::_local_scalar_dense(alias_as_cpu(self));
}

bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && !t.is_quantized() &&
           (t.device().type() == kDevice || t.device().type() == c10::kCPU ||
            t.device().type() == c10::kCUDA);
  };
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) ||
         (dense(self) && dense(from));
}

void record_stream(at::Tensor&, c10::Stream) {}

// Dropout as the CPU takes it (Bernoulli noise like the input, divided by 1-p, times the
// input): the stock composite sends accelerators (is_privateuseone) to native_dropout, whose
// arithmetic and mask dtype differ, so results would not match a CPU run.
at::Tensor dropout(const at::Tensor& input, double p, bool train) {
  TORCH_CHECK(p >= 0 && p <= 1, "dropout probability has to be between 0 and 1, but got ", p);
  if (p == 0 || !train || input.sym_numel() == 0) return input;
  if (p == 1) return input.mul(at::zeros({}, input.options()));
  at::Tensor noise = at::empty_like(input);
  noise.bernoulli_(1 - p);
  noise.div_(1 - p);
  return input.mul(noise);
}

int64_t sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                   std::optional<double> scale, bool enable_gqa) {
  // The op runs the CPU's choice through the fallback.
  return at::_fused_sdp_choice(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa);
}

// ---------------------------------------------------------------------------------------------
// Routing composite ops to the fallback.

bool is_device_type(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::DeviceObjType) return true;
  if (auto opt = type->cast<c10::OptionalType>()) {
    return opt->getElementType()->kind() == c10::TypeKind::DeviceObjType;
  }
  return false;
}

bool mentions_tensor(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::TensorType) return true;
  for (const auto& t : type->containedTypes()) {
    if (mentions_tensor(t)) return true;
  }
  return false;
}

// Why an op keeps its composite on the device (empty: route it).
const char* keep_composite_reason(const c10::FunctionSchema& schema) {
  static const std::set<std::string> kept = {
      "aten::copy_", "aten::copy", "aten::_copy_from", "aten::_copy_from_and_resize",
      "aten::resize_", "aten::resize_as_", "aten::set_", "aten::lift", "aten::lift_fresh",
      "aten::lift_fresh_copy", "aten::_has_compatible_shallow_copy_type", "aten::_to_copy",
      "aten::record_stream", "aten::is_pinned", "aten::_pin_memory", "aten::pin_memory",
      "aten::_local_scalar_dense", "aten::item", "aten::_make_per_tensor_quantized_tensor",
  };
  const std::string& name = schema.name();
  if (kept.count(name) != 0) return "copies or metadata";
  if (name.find("c10d") != std::string::npos || name.rfind("profiler::", 0) == 0 ||
      name.rfind("_dtensor::", 0) == 0) {
    return "collective or profiler";
  }
  for (const auto& r : schema.returns()) {
    if (r.alias_info() != nullptr && !r.alias_info()->isWrite()) return "view";
  }
  bool tensor = false;
  for (const auto& a : schema.arguments()) {
    if (is_device_type(a.type())) return "factory (Device argument)";
    tensor |= mentions_tensor(a.type());
  }
  if (!tensor) return "no tensor argument";
  return nullptr;
}

std::mutex g_route_mutex;
std::vector<c10::RegistrationHandleRAII>& route_handles() {
  static auto* v = new std::vector<c10::RegistrationHandleRAII>();   // kept for the process
  return *v;
}

int64_t route_composites() {
  // LOOM_STANDIN_ROUTE_COMPOSITES=0: a diagnostic that shows what the routing changes.
  if (const char* e = std::getenv("LOOM_STANDIN_ROUTE_COMPOSITES"); e && std::string(e) == "0") {
    return 0;
  }
  std::lock_guard<std::mutex> lock(g_route_mutex);
  auto& dispatcher = c10::Dispatcher::singleton();
  int64_t routed = 0;
  for (const auto& name : dispatcher.getAllOpNames()) {
    auto op = dispatcher.findOp(name);
    if (!op || !op->hasSchema()) continue;
    if (op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;
    if (!op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) {
      continue;
    }
    if (const char* why = keep_composite_reason(op->schema())) {
      if (verbose()) {
        std::fprintf(stderr, "standin: keeps the composite of %s (%s)\n",
                     op_name(*op).c_str(), why);
      }
      continue;
    }
    route_handles().push_back(dispatcher.registerImpl(
        name, c10::DispatchKey::PrivateUse1,
        c10::KernelFunction::makeFromBoxedFunction<&fallback>(), std::nullopt, nullptr,
        "loom standin: composite routed to the CPU kernel"));
    ++routed;
    if (verbose()) std::fprintf(stderr, "standin: routes %s to the CPU kernel\n", op_name(*op).c_str());
  }
  return routed;
}

}  // namespace

std::string device_name(const c10::Device& device) { return device.str(); }

int device_count() {
  static const int n = read_device_count();
  return n;
}

at::Tensor alias_as_cpu(const at::Tensor& t) {
  TORCH_CHECK(t.device().type() == kDevice, "standin: alias_as_cpu of a tensor on ", t.device());
  return make_like(alias_storage(t.storage()), c10::DispatchKey::CPU, t);
}

}  // namespace loom::standin

// -----------------------------------------------------------------------------------------------
// Registration, in the order the static initialisers of this file run.

namespace {
using namespace loom::standin;

const bool g_backend_registered = [] {
  c10::register_privateuse1_backend("standin");
  c10::SetAllocator(c10::DeviceType::PrivateUse1, &g_current_allocator);
  at::RegisterPrivateUse1HooksInterface(new Hooks());
  at::native::_fused_sdp_choice_stub.set_privateuse1_dispatch_ptr(&sdp_choice);
  return true;
}();

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("set_.source_Storage", TORCH_FN(set_storage));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage_offset));
  m.impl("set_.source_Tensor", TORCH_FN(set_tensor));
  m.impl("set_", TORCH_FN(set_empty));
  m.impl("copy_", TORCH_FN(copy_));
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
  m.impl("record_stream", TORCH_FN(record_stream));
  m.impl("dropout", TORCH_FN(dropout));
}

// Above autograd (the ops it calls record the graph), and at the backend key for inference mode.
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) { m.impl("dropout", TORCH_FN(dropout)); }

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}

namespace {
// Last: after the explicit kernels above, so that those ops keep them.
const int64_t g_routed = [] {
  const int64_t n = route_composites();
  if (verbose()) {
    std::fprintf(stderr, "standin: registered device 'standin' (%d devices); %lld composite ops "
                 "routed to their CPU kernels\n", device_count(), static_cast<long long>(n));
  }
  return n;
}();
}  // namespace

extern "C" {

const char* loom_device_plugin_name(void) { return "standin"; }

int64_t loom_standin_current_bytes(int device_index) {
  check_index(device_index);
  return g_counters[device_index].current.load();
}

int64_t loom_standin_peak_bytes(int device_index) {
  check_index(device_index);
  return g_counters[device_index].peak.load();
}

void loom_standin_reset_peak(int device_index) {
  check_index(device_index);
  g_current_allocator.resetPeakStats(static_cast<c10::DeviceIndex>(device_index));
}

int loom_standin_device_count(void) { return device_count(); }

int64_t loom_standin_reroute_composites(void) { return route_composites(); }

int64_t loom_device_plugin_host_waits(void) { return g_host_waits.load(); }

}  // extern "C"
