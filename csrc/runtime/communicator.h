// One process group as Loom's model and training code see it: the collectives they need, each
// bounded by the group's timeout. On host tensors (Gloo) a call returns when the collective is
// done; on a device (NCCL) it returns once the collective is queued on the device, in order
// with the kernels before and after it, so results are read in stream order (and a collective
// that never completes is caught by NCCL's watchdog at the timeout, which ends the process).
// A group lives on one device (the run's:
// runtime/run_device.h) and takes tensors on that device only, of a dtype every backend has
// (NCCL has no bool). Anything else is a programming error, refused with std::logic_error
// naming the collective, the group and the tensor's device or dtype: the check NCCL makes,
// made for every backend and group size so that a misplaced tensor fails on any run with a
// non-CPU device, with a message that names Loom's group. With host staging
// (LOOM_DEVICE_COLLECTIVES=gloo) device tensors are copied through host memory to Gloo.
// A communicator of size 1 does no communication (single-process runs need no c10d at all).
// Semantics follow torch.distributed; "dim 0" collectives follow Megatron's sequence-parallel
// region mappings (docs/design/sp_sar.md, "Regions of a transformer layer under TP + SP").
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace c10d {
class Backend;
class Work;
}

namespace loom::runtime {

enum class ReduceOp { kSum, kMax, kMin };

/// A point-to-point operation in flight (Communicator::isend). wait() throws like the
/// blocking calls; the work keeps the tensor (or its host copy) alive until it completed.
class AsyncWork {
 public:
  virtual ~AsyncWork() = default;
  virtual void wait() = 0;
  virtual bool completed() = 0;
};

class Communicator {
 public:
  /// A size-1 group containing only this process (`global_rank` is its world rank).
  static std::shared_ptr<Communicator> solo(int global_rank = 0, c10::Device device = c10::kCPU);
  /// Wraps a c10d backend whose members are `ranks` (world ranks, sorted); this process is
  /// ranks[backend->getRank()]. Tensors live on `device`; `host_staged`: the backend is Gloo
  /// and device tensors are copied to host memory for it and back.
  Communicator(std::shared_ptr<c10d::Backend> backend, std::vector<int> ranks, std::string name,
               c10::Device device = c10::kCPU, bool host_staged = false);
  ~Communicator();

  int rank() const { return rank_; }        ///< rank inside the group
  int size() const { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& ranks() const { return ranks_; }  ///< world ranks of the members
  const std::string& name() const { return name_; }
  c10::Device device() const { return device_; }  ///< where this group's tensors live

  /// In place: every member ends with the reduction of all members' `t`.
  void all_reduce(at::Tensor& t, ReduceOp op = ReduceOp::kSum);
  /// Concatenation along dim 0 of every member's `t` (all the same shape), in rank order.
  /// [n, ...] → [n·size, ...]. With size() == 1 these dim-0 collectives return `t` itself.
  at::Tensor all_gather_dim0(const at::Tensor& t);
  /// Sum over members, then member r keeps rows [r·n/size, (r+1)·n/size) of dim 0.
  /// [n, ...] → [n/size, ...]; throws std::invalid_argument if n % size != 0.
  at::Tensor reduce_scatter_dim0(const at::Tensor& t);
  /// In place: `t` of rank `root` (group rank) is copied to every member.
  void broadcast(at::Tensor& t, int root);
  /// Point-to-point to/from group rank `peer`; `t` must be contiguous; recv fills `t`.
  void send(const at::Tensor& t, int peer, int tag = 0);
  void recv(at::Tensor& t, int peer, int tag = 0);
  /// Non-blocking send: returns at once; messages to one (peer, tag) arrive in order.
  std::unique_ptr<AsyncWork> isend(const at::Tensor& t, int peer, int tag = 0);
  /// Non-blocking collectives (Megatron-Core's overlapped gradient reduction and parameter
  /// gather): each returns once the collective is queued; its result is in place only after
  /// wait() on the returned work (with host staging, wait() copies it back). Members must issue
  /// a group's collectives in the same order. The tensors must stay alive and untouched until
  /// then. With size() == 1 the work is already complete (reduce-scatter and all-gather copy
  /// `t` into `out`).
  /// all_reduce in place on `t`.
  std::unique_ptr<AsyncWork> all_reduce_async(at::Tensor& t, ReduceOp op = ReduceOp::kSum);
  /// reduce_scatter_dim0 into `out` ([n/size, ...], contiguous, on device()).
  std::unique_ptr<AsyncWork> reduce_scatter_dim0_async(const at::Tensor& t, at::Tensor& out);
  /// all_gather_dim0 into `out` ([n·size, ...], contiguous, on device()).
  std::unique_ptr<AsyncWork> all_gather_dim0_async(const at::Tensor& t, at::Tensor& out);
  /// Returns once every member has reached it, on the host as well (a device group waits for
  /// its device too).
  void barrier();

  /// Waits for pending work and shuts the backend down; later calls throw. Idempotent.
  void shutdown();

 private:
  Communicator(int global_rank, c10::Device device);  // solo
  c10d::Backend& live();                   // the backend; throws after shutdown()
  /// Throws std::logic_error unless `t` is on device() with a dtype every backend has.
  void check(const char* what, const at::Tensor& t) const;
  /// The tensor the backend sees: `t`, or its host copy when staging.
  at::Tensor to_backend(const at::Tensor& t) const;
  /// What the dim-0 collectives share once `out` is checked: over one rank `out` = `t`; else
  /// `start(backend, out_buffer, input)` on `t` as the backend sees it and `out` (staged on the
  /// host when staging), the work named "<op> on process group '<name>'".
  using Dim0Start = std::function<c10::intrusive_ptr<c10d::Work>(c10d::Backend&, at::Tensor&, at::Tensor&)>;
  std::unique_ptr<AsyncWork> start_dim0(const char* op, const at::Tensor& t, at::Tensor& out, const Dim0Start& start);
  std::shared_ptr<c10d::Backend> backend_;
  std::vector<int> ranks_;
  std::string name_;
  c10::Device device_{c10::kCPU};
  bool host_staged_ = false;
  int rank_ = 0;
};

using CommunicatorPtr = std::shared_ptr<Communicator>;

}  // namespace loom::runtime
