// The stand-in device's communicator: a c10d backend for standin tensors that checks its
// arguments the way ProcessGroupNCCL does and moves the data with a ProcessGroupGloo built over
// the same store. Gloo reads and writes the standin memory directly (CPU aliases, no copies).
//
// It also keeps the NCCL semantics that decide whether a schedule deadlocks: the operations of
// one communicator run one at a time, in the order they were issued (NCCL's one stream per
// communicator); point-to-point messages carry no tags (each direction's messages match in
// order); and a send completes only once the receiver has taken the data (a rendezvous, stricter
// than NCCL's buffering of small messages). A schedule that could deadlock on GPUs therefore
// deadlocks here too, and fails at the collective timeout instead of passing by luck.
#include "standin_device.h"
#include "standin_internal.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace loom::standin {
namespace {

using c10d::ReduceOp;
using TensorVec = std::vector<at::Tensor>;

const char* nccl_dtype_hint(c10::ScalarType t) {
  switch (t) {
    case c10::kBool: return "send flags as uint8 or int32";
    case c10::kComplexHalf:
    case c10::kComplexFloat:
    case c10::kComplexDouble: return "send at::view_as_real of it";
    default: return "convert it to a supported type: int8, uint8, int32, int64, fp16, fp32, "
                    "fp64 or bf16";
  }
}

// The work of one operation run by an OrderedStream: complete once the stream has run it.
class OrderedWork final : public c10d::Work {
 public:
  void complete(std::exception_ptr error) { finish(std::move(error)); }
};

// A worker thread that runs one communicator's operations one after another, in the order they
// were submitted: the stand-in's counterpart of an NCCL communicator's stream.
class OrderedStream {
 public:
  OrderedStream() : worker_([this] { run(); }) {}
  ~OrderedStream() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  c10::intrusive_ptr<c10d::Work> submit(std::function<void()> task) {
    auto work = c10::make_intrusive<OrderedWork>();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.emplace_back(std::move(task), work);
    }
    cv_.notify_all();
    return work;
  }

 private:
  void run() {
    for (;;) {
      std::pair<std::function<void()>, c10::intrusive_ptr<OrderedWork>> item;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, nothing left to run
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr error;
      try {
        item.first();
      } catch (...) {
        error = std::current_exception();
      }
      // Release the operation's tensors before the waiter wakes, as an NCCL stream holds none
      // once the work is done: device memory read after a wait must not count them.
      item.first = nullptr;
      item.second->complete(error);
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<void()>, c10::intrusive_ptr<OrderedWork>>> queue_;
  bool stopping_ = false;
  std::thread worker_;  // last: starts once the members above exist
};

// Gloo tags of the stand-in's point-to-point traffic: the data (callers' tags are ignored, as
// NCCL ignores them) and the receiver's acknowledgement that makes a send a rendezvous.
constexpr int kDataTag = 0;
constexpr int kAckTag = 1;

class StandinBackend final : public c10d::Backend {
 public:
  StandinBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                 std::chrono::milliseconds timeout, int device_index)
      : c10d::Backend(rank, size),
        device_(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device_index)) {
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    options->threads = 2;
    gloo_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
    setBoundDeviceId(device_);
    check_distinct_devices();
    stream_ = std::make_unique<OrderedStream>();
  }

  const std::string getBackendName() const override { return "standin"; }

  void setTimeout(std::chrono::milliseconds timeout) override { gloo_->setTimeout(timeout); }

  c10::intrusive_ptr<c10d::Work> broadcast(TensorVec& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    auto cpu = check_all("broadcast", tensors);
    return in_order([=]() mutable { return gloo_->broadcast(cpu, opts); });
  }

  c10::intrusive_ptr<c10d::Work> allreduce(TensorVec& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    check_op("all_reduce", opts.reduceOp);
    auto cpu = check_all("all_reduce", tensors);
    c10d::AllreduceOptions o = opts;
    const bool avg = take_avg(o.reduceOp);
    return in_order([=]() mutable { return gloo_->allreduce(cpu, o); }, avg, tensors);
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      TensorVec& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    check_op("all_reduce_coalesced", opts.reduceOp);
    auto cpu = check_all("all_reduce_coalesced", tensors);
    c10d::AllreduceCoalescedOptions o = opts;
    const bool avg = take_avg(o.reduceOp);
    return in_order([=]() mutable { return gloo_->allreduce_coalesced(cpu, o); }, avg, tensors);
  }

  c10::intrusive_ptr<c10d::Work> reduce(TensorVec& tensors,
                                        const c10d::ReduceOptions& opts) override {
    check_op("reduce", opts.reduceOp);
    auto cpu = check_all("reduce", tensors);
    c10d::ReduceOptions o = opts;
    const bool avg = take_avg(o.reduceOp);
    TensorVec on_root = getRank() == o.rootRank ? tensors : TensorVec{};
    return in_order([=]() mutable { return gloo_->reduce(cpu, o); }, avg, on_root);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<TensorVec>& outputs, TensorVec& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    auto in = check_all("all_gather", inputs);
    auto out = check_all("all_gather", outputs);
    return in_order([=]() mutable { return gloo_->allgather(out, in, opts); });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    at::Tensor in = check("all_gather_into_tensor", input);
    at::Tensor out = check("all_gather_into_tensor", output);
    return in_order([=]() mutable { return gloo_->_allgather_base(out, in, opts); });
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      TensorVec& outputs, TensorVec& inputs, const c10d::AllgatherOptions& opts) override {
    auto in = check_all("all_gather_into_tensor_coalesced", inputs);
    auto out = check_all("all_gather_into_tensor_coalesced", outputs);
    return in_order([=]() mutable { return gloo_->allgather_into_tensor_coalesced(out, in, opts); });
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<TensorVec>& outputs, TensorVec& inputs,
                                        const c10d::GatherOptions& opts) override {
    auto in = check_all("gather", inputs);
    auto out = check_all("gather", outputs);
    return in_order([=]() mutable { return gloo_->gather(out, in, opts); });
  }

  c10::intrusive_ptr<c10d::Work> scatter(TensorVec& outputs, std::vector<TensorVec>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    auto out = check_all("scatter", outputs);
    auto in = check_all("scatter", inputs);
    return in_order([=]() mutable { return gloo_->scatter(out, in, opts); });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(TensorVec& outputs,
                                                std::vector<TensorVec>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    check_op("reduce_scatter", opts.reduceOp);
    auto out = check_all("reduce_scatter", outputs);
    auto in = check_all("reduce_scatter", inputs);
    c10d::ReduceScatterOptions o = opts;
    const bool avg = take_avg(o.reduceOp);
    return in_order([=]() mutable { return gloo_->reduce_scatter(out, in, o); }, avg, outputs);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    check_op("reduce_scatter_tensor", opts.reduceOp);
    at::Tensor out = check("reduce_scatter_tensor", output);
    at::Tensor in = check("reduce_scatter_tensor", input);
    c10d::ReduceScatterOptions o = opts;
    const bool avg = take_avg(o.reduceOp);
    return in_order([=]() mutable { return gloo_->_reduce_scatter_base(out, in, o); }, avg, {output});
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      TensorVec& outputs, TensorVec& inputs, const c10d::ReduceScatterOptions& opts) override {
    check_op("reduce_scatter_tensor_coalesced", opts.reduceOp);
    auto out = check_all("reduce_scatter_tensor_coalesced", outputs);
    auto in = check_all("reduce_scatter_tensor_coalesced", inputs);
    c10d::ReduceScatterOptions o = opts;
    const bool avg = take_avg(o.reduceOp);
    return in_order([=]() mutable { return gloo_->reduce_scatter_tensor_coalesced(out, in, o); }, avg,
                    outputs);
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override {
    at::Tensor out = check("all_to_all_single", output);
    at::Tensor in = check("all_to_all_single", input);
    return in_order([=]() mutable { return gloo_->alltoall_base(out, in, output_splits, input_splits, opts); });
  }

  // A send is done when the receiver has acknowledged the data (a rendezvous); the caller's
  // tag is ignored, as NCCL ignores it.
  c10::intrusive_ptr<c10d::Work> send(TensorVec& tensors, int dst, int /*tag*/) override {
    auto cpu = check_all("send", tensors);
    return stream().submit([this, cpu, dst]() mutable {
      gloo_->send(cpu, dst, kDataTag)->wait();
      TensorVec ack{at::zeros({1}, at::kByte)};
      gloo_->recv(ack, dst, kAckTag)->wait();
    });
  }

  c10::intrusive_ptr<c10d::Work> recv(TensorVec& tensors, int src, int /*tag*/) override {
    auto cpu = check_all("recv", tensors);
    return stream().submit([this, cpu, src]() mutable {
      gloo_->recv(cpu, src, kDataTag)->wait();
      TensorVec ack{at::zeros({1}, at::kByte)};
      gloo_->send(ack, src, kAckTag)->wait();
    });
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(TensorVec&, int) override {
    TORCH_CHECK(false, "standin communicator: recv from any source is not supported "
                       "(NCCL does not support it either)");
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    return in_order([=] { return gloo_->barrier(opts); });
  }

  void setSequenceNumberForGroup() override { gloo_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return gloo_->getSequenceNumberForGroup(); }
  void abort() override { gloo_->abort(); }
  void shutdown() override {
    stream_.reset();  // runs what was submitted, then stops
    gloo_->shutdown();
  }

 private:
  // NCCL refuses a communicator with two ranks on one GPU ("Duplicate GPU detected"); so does
  // the stand-in, for two ranks on one standin device of one host.
  void check_distinct_devices() {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    const int64_t host_key = static_cast<int64_t>(std::hash<std::string>{}(host) >> 1);
    at::Tensor mine = at::tensor({host_key, static_cast<int64_t>(device_.index())}, at::kLong);
    at::Tensor flat = at::empty({getSize() * 2}, at::kLong);
    gloo_->_allgather_base(flat, mine, {})->wait();
    at::Tensor all = flat.view({getSize(), 2});
    auto a = all.accessor<int64_t, 2>();
    for (int i = 0; i < getSize(); ++i) {
      for (int j = i + 1; j < getSize(); ++j) {
        TORCH_CHECK(a[i][0] != a[j][0] || a[i][1] != a[j][1], "standin communicator: ranks ", i,
                    " and ", j, " of the group are both on standin:", a[i][1],
                    " of one host (NCCL refuses this too: \"Duplicate GPU detected\"); "
                    "give each rank its own device (LOCAL_RANK)");
      }
    }
  }

  at::Tensor check(const char* op, const at::Tensor& t) const {
    TORCH_CHECK(t.defined(), "standin communicator: ", op, " got an undefined tensor");
    if (t.device() != device_ || t.layout() != c10::kStrided) {
      const std::string layout =
          t.layout() == c10::kStrided ? "" : c10::str(" (", t.layout(), ")");
      TORCH_CHECK(false, "standin communicator: ", op, " got a tensor on ",
                  device_name(t.device()), layout, ", expected ", device_name(device_),
                  " (NCCL takes tensors on the communicator's device only)");
    }
    switch (t.scalar_type()) {
      case c10::kChar:
      case c10::kByte:
      case c10::kInt:
      case c10::kLong:
      case c10::kHalf:
      case c10::kFloat:
      case c10::kDouble:
      case c10::kBFloat16:
        break;
      case c10::kUInt16:
      case c10::kUInt32:
      case c10::kUInt64:
        TORCH_CHECK(false, "standin communicator: ", op, " got a tensor of dtype ",
                    t.scalar_type(), ", which Gloo cannot carry (NCCL can); use int32 or int64");
      default:
        TORCH_CHECK(false, "standin communicator: ", op, " got a tensor of dtype ",
                    t.scalar_type(), "; NCCL has no ", t.scalar_type(), " type (",
                    nccl_dtype_hint(t.scalar_type()), ")");
    }
    TORCH_CHECK(t.is_contiguous(), "standin communicator: ", op,
                " got a non-contiguous tensor (sizes ", t.sizes(), ", strides ", t.strides(),
                "); NCCL takes contiguous tensors only (and for send/recv would move the raw "
                "memory span), so make it contiguous first");
    return alias_as_cpu(t);
  }

  TensorVec check_all(const char* op, const TensorVec& ts) const {
    TensorVec cpu;
    cpu.reserve(ts.size());
    for (const auto& t : ts) cpu.push_back(check(op, t));
    return cpu;
  }

  std::vector<TensorVec> check_all(const char* op, const std::vector<TensorVec>& lists) const {
    std::vector<TensorVec> cpu;
    cpu.reserve(lists.size());
    for (const auto& l : lists) cpu.push_back(check_all(op, l));
    return cpu;
  }

  static void check_op(const char* op, const ReduceOp& r) {
    switch (r.op_) {
      case ReduceOp::SUM:
      case ReduceOp::AVG:
      case ReduceOp::PRODUCT:
      case ReduceOp::MIN:
      case ReduceOp::MAX:
        return;
      case ReduceOp::BAND:
      case ReduceOp::BOR:
      case ReduceOp::BXOR:
        TORCH_CHECK(false, "standin communicator: ", op,
                    " with a bitwise reduction: NCCL has none (use MIN/MAX on int flags)");
      default:
        TORCH_CHECK(false, "standin communicator: ", op, " with reduction ",
                    static_cast<int>(r.op_), " is not supported by the stand-in");
    }
  }

  // Gloo has no AVG: it sums, and the work divides by the group size when it has finished.
  static bool take_avg(ReduceOp& r) {
    if (r.op_ != ReduceOp::AVG) return false;
    r = ReduceOp(ReduceOp::SUM);
    return true;
  }

  // Runs a Gloo operation on the stream, in issue order, waiting for it there; AVG divides the
  // sum by the group size once it is done.
  template <class Issue>
  c10::intrusive_ptr<c10d::Work> in_order(Issue issue, bool avg = false, TensorVec tensors = {}) {
    const int64_t size = getSize();
    return stream().submit([issue = std::move(issue), avg, tensors = std::move(tensors), size]() mutable {
      c10::intrusive_ptr<c10d::Work> work = issue();
      work->wait();
      // Gloo's worker thread drops its own reference to the work (and the tensors it holds) just
      // after completing it: wait for that, briefly, so that an operation's buffers are freed
      // before its waiter wakes, as on a CUDA stream (device memory read after a step must not
      // count the step's last collective by chance).
      for (int i = 0; i < 100000 && work.use_count() > 1; ++i) std::this_thread::yield();
      work.reset();
      if (!avg) return;
      for (const auto& t : tensors) {
        if (at::isFloatingType(t.scalar_type())) {
          t.div_(size);
        } else {
          t.div_(size, "trunc");
        }
      }
    });
  }

  OrderedStream& stream() {
    TORCH_CHECK(stream_ != nullptr, "standin communicator: used after shutdown()");
    return *stream_;
  }

  c10::Device device_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo_;
  std::unique_ptr<OrderedStream> stream_;  // this communicator's operations, in order
};

}  // namespace
}  // namespace loom::standin

extern "C" c10d::Backend* loom_device_plugin_make_backend(c10d::Store* store, int rank, int size,
                                                          int64_t timeout_ms, int device_index) {
  using loom::standin::device_count;
  TORCH_CHECK(store != nullptr, "standin communicator: the store is null");
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "standin communicator: rank ", rank,
              " is not in a group of size ", size);
  TORCH_CHECK(device_index >= 0 && device_index < device_count(), "standin communicator: device "
              "index ", device_index, " is out of range: there are ", device_count(),
              " standin devices (LOOM_STANDIN_DEVICE_COUNT)");
  TORCH_CHECK(timeout_ms > 0, "standin communicator: timeout_ms must be positive, got ",
              timeout_ms);
  auto owned = c10::intrusive_ptr<c10d::Store>::unsafe_reclaim_from_nonowning(store);
  auto backend = c10::make_intrusive<loom::standin::StandinBackend>(
      owned, rank, size, std::chrono::milliseconds(timeout_ms), device_index);
  return backend.release();
}
