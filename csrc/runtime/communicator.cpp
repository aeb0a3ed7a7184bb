#include "runtime/communicator.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <functional>
#include <stdexcept>
#include <utility>

#include "runtime/error_text.h"
#include "runtime/run_device.h"

namespace loom::runtime {
namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return c10d::ReduceOp::SUM;
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
  }
  throw std::invalid_argument("unknown reduce op");
}

// Runs one collective and waits for it; failures name the group and the operation.
template <typename F>
void run(const std::string& group, const char* what, F&& issue) {
  try {
    auto work = issue();
    work->wait();
  } catch (const std::exception& e) {
    throw std::runtime_error("collective " + std::string(what) + " on process group '" + group +
                             "' failed: " + error_text(e));
  }
}

// The dtypes NCCL reduces and moves (docs/design/devices.md); Gloo has them all too.
bool every_backend_has(at::ScalarType t) {
  switch (t) {
    case at::kByte: case at::kChar: case at::kInt: case at::kLong:
    case at::kHalf: case at::kFloat: case at::kDouble: case at::kBFloat16:
      return true;
    default:
      return false;
  }
}

}  // namespace

std::shared_ptr<Communicator> Communicator::solo(int global_rank, c10::Device device) {
  return std::shared_ptr<Communicator>(new Communicator(global_rank, device));
}

Communicator::Communicator(int global_rank, c10::Device device)
    : ranks_{global_rank}, name_("solo"), device_(device), rank_(0) {}

Communicator::Communicator(std::shared_ptr<c10d::Backend> backend, std::vector<int> ranks,
                           std::string name, c10::Device device, bool host_staged)
    : backend_(std::move(backend)),
      ranks_(std::move(ranks)),
      name_(std::move(name)),
      device_(device),
      host_staged_(host_staged && !device.is_cpu()) {
  rank_ = backend_->getRank();
  if (backend_->getSize() != static_cast<int>(ranks_.size())) {
    throw std::logic_error("process group '" + name_ + "' has " +
                           std::to_string(backend_->getSize()) + " members, expected " +
                           std::to_string(ranks_.size()));
  }
}

Communicator::~Communicator() {
  try {
    shutdown();
  } catch (...) {
    // Destructors must not throw; an explicit shutdown() reports errors.
  }
}

c10d::Backend& Communicator::live() {
  if (!backend_) throw std::runtime_error("process group '" + name_ + "' was shut down");
  return *backend_;
}

void Communicator::check(const char* what, const at::Tensor& t) const {
  if (!t.defined())
    throw std::logic_error(std::string(what) + " on process group '" + name_ +
                                "' got an undefined tensor");
  if (t.device() != device_)
    throw std::logic_error(std::string(what) + " on process group '" + name_ +
                                "' got a tensor on " + t.device().str() + ", expected " +
                                device_.str() + " (the group's device)");
  if (!every_backend_has(t.scalar_type()))
    throw std::logic_error(std::string(what) + " on process group '" + name_ + "' got a " +
                                std::string(c10::toString(t.scalar_type())) +
                                " tensor; collectives take int8/uint8/int32/int64/fp16/bf16/"
                                "fp32/fp64 (NCCL has no bool: send flags as uint8 or int32)");
}

at::Tensor Communicator::to_backend(const at::Tensor& t) const {
  return host_staged_ ? t.to(at::kCPU).contiguous() : (t.is_contiguous() ? t : t.contiguous());
}

void Communicator::all_reduce(at::Tensor& t, ReduceOp op) {
  check("all_reduce", t);
  if (size() == 1) return;
  at::Tensor buf = to_backend(t);
  std::vector<at::Tensor> v{buf};
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(op);
  run(name_, "all_reduce", [&] { return live().allreduce(v, opts); });
  if (!buf.is_same(t)) t.copy_(buf);
}

at::Tensor Communicator::all_gather_dim0(const at::Tensor& t) {
  check("all_gather", t);
  if (size() == 1) return t;
  at::Tensor in = to_backend(t);
  auto sizes = in.sizes().vec();
  if (sizes.empty()) throw std::invalid_argument("all_gather_dim0 needs a tensor with dim >= 1");
  sizes[0] *= size();
  at::Tensor out = at::empty(sizes, in.options());
  run(name_, "all_gather", [&] { return live()._allgather_base(out, in); });
  return out.to(device_);
}

at::Tensor Communicator::reduce_scatter_dim0(const at::Tensor& t) {
  check("reduce_scatter", t);
  if (size() == 1) return t;
  if (t.dim() < 1 || t.size(0) % size() != 0) {
    throw std::invalid_argument("reduce_scatter_dim0 on group '" + name_ + "': dim 0 of size " +
                                std::to_string(t.dim() ? t.size(0) : 0) +
                                " is not divisible by the group size " + std::to_string(size()));
  }
  at::Tensor in = to_backend(t);
  auto sizes = in.sizes().vec();
  sizes[0] /= size();
  at::Tensor out = at::empty(sizes, in.options());
  run(name_, "reduce_scatter", [&] { return live()._reduce_scatter_base(out, in); });
  return out.to(device_);
}

void Communicator::broadcast(at::Tensor& t, int root) {
  check("broadcast", t);
  if (size() == 1) return;
  at::Tensor buf = to_backend(t);
  std::vector<at::Tensor> v{buf};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  run(name_, "broadcast", [&] { return live().broadcast(v, opts); });
  if (!buf.is_same(t)) t.copy_(buf);
}

void Communicator::send(const at::Tensor& t, int peer, int tag) {
  check("send", t);
  if (!t.is_contiguous()) throw std::invalid_argument("send needs a contiguous tensor");
  if (peer == rank_) throw std::invalid_argument("send to self on group '" + name_ + "'");
  std::vector<at::Tensor> v{to_backend(t)};
  run(name_, "send", [&] { return live().send(v, peer, tag); });
}

void Communicator::recv(at::Tensor& t, int peer, int tag) {
  check("recv", t);
  if (!t.is_contiguous()) throw std::invalid_argument("recv needs a contiguous tensor");
  if (peer == rank_) throw std::invalid_argument("recv from self on group '" + name_ + "'");
  at::Tensor buf = host_staged_ ? at::empty(t.sizes(), t.options().device(at::kCPU)) : t;
  std::vector<at::Tensor> v{buf};
  run(name_, "recv", [&] { return live().recv(v, peer, tag); });
  if (!buf.is_same(t)) t.copy_(buf);
}

namespace {
class C10dWork final : public AsyncWork {
 public:
  // `keep` are the buffers the backend uses (host copies when staging): alive until done.
  // `finish` runs once after the first successful wait (copies a staged result back).
  C10dWork(c10::intrusive_ptr<c10d::Work> work, std::vector<at::Tensor> keep, std::string what,
           std::function<void()> finish = {})
      : work_(std::move(work)), keep_(std::move(keep)), what_(std::move(what)), finish_(std::move(finish)) {}
  void wait() override {
    try {
      work_->wait();
    } catch (const std::exception& e) {
      throw std::runtime_error(what_ + " failed: " + error_text(e));
    }
    if (finish_) std::exchange(finish_, {})();
  }
  bool completed() override { return work_->isCompleted(); }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::vector<at::Tensor> keep_;
  std::string what_;
  std::function<void()> finish_;
};

// The work of a collective a size-1 group does not need to run.
class DoneWork final : public AsyncWork {
 public:
  void wait() override {}
  bool completed() override { return true; }
};

// Checks that `out` can take the result of a dim-0 collective of `t` on a group of `size`.
void check_dim0_out(const std::string& group, const char* what, const at::Tensor& t, const at::Tensor& out,
                    int64_t rows) {
  auto sizes = t.sizes().vec();
  if (sizes.empty()) throw std::invalid_argument(std::string(what) + " needs a tensor with dim >= 1");
  sizes[0] = rows;
  if (out.sizes().vec() != sizes || out.scalar_type() != t.scalar_type() || !out.is_contiguous())
    throw std::invalid_argument(std::string(what) + " on group '" + group + "': the output must be a contiguous " +
                                std::string(c10::toString(t.scalar_type())) + " tensor of shape " + c10::str(sizes) +
                                ", got " + c10::str(out.sizes()));
}

// Where a dim-0 collective writes: `out` itself, or a host buffer on a host-staged group (the
// stand-in device's Gloo path), copied into `out` when the work is waited for.
struct StagedOutput {
  at::Tensor buf;
  std::function<void()> finish;
};

StagedOutput staged_output(at::Tensor& out, bool host_staged) {
  if (!host_staged) return {out, {}};
  at::Tensor buf = at::empty(out.sizes(), out.options().device(at::kCPU));
  return {buf, [out, buf]() mutable { out.copy_(buf); }};
}
}  // namespace

std::unique_ptr<AsyncWork> Communicator::all_reduce_async(at::Tensor& t, ReduceOp op) {
  check("all_reduce", t);
  if (size() == 1) return std::make_unique<DoneWork>();
  at::Tensor buf = to_backend(t);
  std::vector<at::Tensor> v{buf};
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(op);
  std::function<void()> finish;
  if (!buf.is_same(t)) finish = [t, buf]() mutable { t.copy_(buf); };
  return std::make_unique<C10dWork>(live().allreduce(v, opts), std::vector<at::Tensor>{buf, t},
                                    "all_reduce on process group '" + name_ + "'", std::move(finish));
}

std::unique_ptr<AsyncWork> Communicator::reduce_scatter_dim0_async(const at::Tensor& t, at::Tensor& out) {
  check("reduce_scatter", t);
  check("reduce_scatter", out);
  if (t.dim() < 1 || t.size(0) % size() != 0) {
    throw std::invalid_argument("reduce_scatter_dim0 on group '" + name_ + "': dim 0 of size " +
                                std::to_string(t.dim() ? t.size(0) : 0) +
                                " is not divisible by the group size " + std::to_string(size()));
  }
  check_dim0_out(name_, "reduce_scatter_dim0_async", t, out, t.size(0) / size());
  return start_dim0("reduce_scatter", t, out, [](c10d::Backend& b, at::Tensor& buf, at::Tensor& in) {
    return b._reduce_scatter_base(buf, in);
  });
}

std::unique_ptr<AsyncWork> Communicator::all_gather_dim0_async(const at::Tensor& t, at::Tensor& out) {
  check("all_gather", t);
  check("all_gather", out);
  check_dim0_out(name_, "all_gather_dim0_async", t, out, (t.dim() ? t.size(0) : 0) * size());
  return start_dim0("all_gather", t, out, [](c10d::Backend& b, at::Tensor& buf, at::Tensor& in) {
    return b._allgather_base(buf, in);
  });
}

std::unique_ptr<AsyncWork> Communicator::start_dim0(const char* op, const at::Tensor& t, at::Tensor& out,
                                                    const Dim0Start& start) {
  if (size() == 1) {
    out.copy_(t);
    return std::make_unique<DoneWork>();
  }
  at::Tensor in = to_backend(t);
  StagedOutput o = staged_output(out, host_staged_);
  return std::make_unique<C10dWork>(start(live(), o.buf, in), std::vector<at::Tensor>{in, o.buf, out},
                                    std::string(op) + " on process group '" + name_ + "'", std::move(o.finish));
}

std::unique_ptr<AsyncWork> Communicator::isend(const at::Tensor& t, int peer, int tag) {
  check("isend", t);
  if (!t.is_contiguous()) throw std::invalid_argument("isend needs a contiguous tensor");
  if (peer == rank_) throw std::invalid_argument("isend to self on group '" + name_ + "'");
  at::Tensor buf = to_backend(t);
  std::vector<at::Tensor> v{buf};
  return std::make_unique<C10dWork>(live().send(v, peer, tag), std::vector<at::Tensor>{buf},
                                    "send on process group '" + name_ + "'");
}

void Communicator::barrier() {
  if (size() == 1) return;
  // A barrier as a one-element all-reduce on the group's device: same timeout and error path
  // as other collectives (NCCL's own barrier guesses the device). On a device, waiting for the
  // work only orders the current stream; synchronizing makes it a barrier for the host too.
  at::Tensor one = at::ones({1}, at::TensorOptions().device(device_));
  all_reduce(one);
  synchronize(device_);
}

void Communicator::shutdown() {
  if (!backend_) return;
  auto backend = std::move(backend_);
  backend->shutdown();
}

}  // namespace loom::runtime
