// The stand-in accelerator's plugin contract: the C entry points of libloom_standin_device.so.
//
// Loading the library (dlopen or linking) registers a CPU-backed device through PyTorch's
// PrivateUse1 dispatch key under the name "standin" (tensors print as standin:0), from static
// initialisers; nothing needs to be called first. Load it before the process's first backward()
// (autograd sizes its device queues once) and never dlclose it. A test tool only: never part of
// the `loom` binary users run, never loaded into a GPU run. See README.md beside this file.
//
// Every function is exported with C linkage so that Loom's runtime can dlsym() it by name.
// The functions taking a device index throw c10::Error (a std::exception) for an index outside
// [0, device count); C linkage does not make them noexcept.
#pragma once

#include <stdint.h>

#ifdef __cplusplus
namespace c10d {
class Backend;
class Store;
}  // namespace c10d
extern "C" {
#endif

/// The device's name as registered with PyTorch: "standin" (static storage, never freed).
const char* loom_device_plugin_name(void);

/// Bytes (not rounded) allocated on standin:<device_index> now: tensors made on the device,
/// results of kernels run for it and storage grown by resize_. Freed memory is subtracted.
int64_t loom_standin_current_bytes(int device_index);

/// Highest loom_standin_current_bytes(device_index) since load or the last reset, in bytes.
int64_t loom_standin_peak_bytes(int device_index);

/// Sets the peak of standin:<device_index> to its current bytes (like
/// torch.cuda.reset_peak_memory_stats). The same counters are also read and reset through
/// c10::getDeviceAllocator(PrivateUse1): getDeviceStats(i).allocated_bytes[AGGREGATE],
/// resetPeakStats(i).
void loom_standin_reset_peak(int device_index);

/// Number of devices: LOOM_STANDIN_DEVICE_COUNT (1..64) read at load time, default 16.
int loom_standin_device_count(void);

/// Routes to the CPU kernels every operator registered since load that has a
/// CompositeExplicitAutograd kernel and no standin kernel (load time already did this for the
/// operators present then; call it after loading another op library, e.g. libloom_ops.so,
/// if that library was loaded later). Returns how many operators it routed; 0 when none.
int64_t loom_standin_reroute_composites(void);

/// Times the host has waited for any standin device since load, as it would on CUDA: scalar
/// reads (.item(), _local_scalar_dense), copies to host memory, copies from host memory that
/// block (non_blocking false, or a source that is not pinned) and synchronize calls. An
/// optional plugin entry point: Loom's step log records it per training step
/// (docs/design/devices.md, "Host waits").
int64_t loom_device_plugin_host_waits(void);

#ifdef __cplusplus
/// A c10d communicator for standin tensors ("standin" backend, NCCL-like checks, Gloo
/// underneath).
///   store        the group's store, not owned (the backend takes its own reference); use a
///                store (PrefixStore) of this group alone, as for ProcessGroupGloo;
///   rank, size   this process's rank in the group and the group's size;
///   timeout_ms   Gloo's timeout for every collective and point-to-point op, milliseconds;
///   device_index the standin device this rank's tensors live on (one rank per device).
/// Returns a new reference (c10::intrusive_ptr<c10d::Backend>::reclaim it). Throws
/// c10::Error for a null store, a bad rank/size or device index; Gloo's rendezvous errors
/// (e.g. a peer that never connects within timeout_ms) propagate.
/// Every op refuses, with a c10::Error naming the op, a tensor that is not a dense contiguous
/// standin tensor on standin:<device_index> and a dtype NCCL lacks.
c10d::Backend* loom_device_plugin_make_backend(c10d::Store* store, int rank, int size,
                                               int64_t timeout_ms, int device_index);
}
#endif
