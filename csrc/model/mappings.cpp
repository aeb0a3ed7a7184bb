#include "model/mappings.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <stdexcept>
#include <string>

#include "model/capsule.h"

namespace loom::model {

namespace comm {

at::Tensor all_gather_dim0(const at::Tensor& x, runtime::Communicator& tp) {
  if (tp.size() == 1) return x;
  return tp.all_gather_dim0(x.contiguous());
}

at::Tensor reduce_scatter_dim0(const at::Tensor& x, runtime::Communicator& tp) {
  if (tp.size() == 1) return x;
  if (x.size(0) % tp.size() != 0)
    throw std::invalid_argument("reduce-scatter over the sequence: dim 0 of size " +
                                std::to_string(x.size(0)) + " is not divisible by the " +
                                "tensor-parallel size " + std::to_string(tp.size()));
  return tp.reduce_scatter_dim0(x.contiguous());
}

at::Tensor all_reduce(const at::Tensor& x, runtime::Communicator& tp, runtime::ReduceOp op) {
  if (tp.size() == 1) return x;
  at::Tensor y = x.contiguous().clone();
  tp.all_reduce(y, op);
  return y;
}

at::Tensor all_gather_last_dim(const at::Tensor& x, runtime::Communicator& tp) {
  if (tp.size() == 1) return x;
  const int64_t last = x.dim() - 1;
  at::Tensor gathered = tp.all_gather_dim0(x.movedim(last, 0).contiguous());  // [t·n, ...]
  return gathered.movedim(0, last).contiguous();
}

at::Tensor split_dim(const at::Tensor& x, int64_t dim, const runtime::Communicator& tp) {
  if (tp.size() == 1) return x;
  const int64_t n = x.size(dim);
  if (n % tp.size() != 0)
    throw std::invalid_argument("split over the tensor-parallel group: dimension " +
                                std::to_string(dim) + " of size " + std::to_string(n) +
                                " is not divisible by " + std::to_string(tp.size()));
  const int64_t part = n / tp.size();
  return x.narrow(dim, tp.rank() * part, part).contiguous();
}

}  // namespace comm

namespace {

runtime::Communicator& group(AutogradContext* ctx) {
  return *detail::from_capsule<CommunicatorPtr>(ctx->saved_data["tp"]);
}

struct CopyToTensorParallel : Function<CopyToTensorParallel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const CommunicatorPtr& tp) {
    ctx->saved_data["tp"] = detail::make_capsule(tp);
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {comm::all_reduce(g[0], group(ctx)), at::Tensor()};
  }
};

struct ReduceFromTensorParallel : Function<ReduceFromTensorParallel> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, const CommunicatorPtr& tp) {
    return comm::all_reduce(x, *tp);
  }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0], at::Tensor()}; }
};

struct ScatterToTensorParallel : Function<ScatterToTensorParallel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const CommunicatorPtr& tp) {
    ctx->saved_data["tp"] = detail::make_capsule(tp);
    return comm::split_dim(x, x.dim() - 1, *tp);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {comm::all_gather_last_dim(g[0], group(ctx)), at::Tensor()};
  }
};

struct GatherFromTensorParallel : Function<GatherFromTensorParallel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const CommunicatorPtr& tp) {
    ctx->saved_data["tp"] = detail::make_capsule(tp);
    return comm::all_gather_last_dim(x, *tp);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {comm::split_dim(g[0], g[0].dim() - 1, group(ctx)), at::Tensor()};
  }
};

struct ScatterToSequenceParallel : Function<ScatterToSequenceParallel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const CommunicatorPtr& tp) {
    ctx->saved_data["tp"] = detail::make_capsule(tp);
    return comm::split_dim(x, 0, *tp);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {comm::all_gather_dim0(g[0], group(ctx)), at::Tensor()};
  }
};

struct GatherFromSequenceParallel : Function<GatherFromSequenceParallel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const CommunicatorPtr& tp,
                            bool tensor_parallel_output_grad) {
    ctx->saved_data["tp"] = detail::make_capsule(tp);
    ctx->saved_data["tp_grad"] = tensor_parallel_output_grad;
    return comm::all_gather_dim0(x, *tp);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto& tp = group(ctx);
    at::Tensor dx = ctx->saved_data["tp_grad"].toBool() ? comm::reduce_scatter_dim0(g[0], tp)
                                                        : comm::split_dim(g[0], 0, tp);
    return {dx, at::Tensor(), at::Tensor()};
  }
};

struct ReduceScatterToSequenceParallel : Function<ReduceScatterToSequenceParallel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const CommunicatorPtr& tp) {
    ctx->saved_data["tp"] = detail::make_capsule(tp);
    return comm::reduce_scatter_dim0(x, *tp);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {comm::all_gather_dim0(g[0], group(ctx)), at::Tensor()};
  }
};

}  // namespace

at::Tensor copy_to_tensor_model_parallel_region(const at::Tensor& x, const CommunicatorPtr& tp) {
  if (tp->size() == 1) return x;
  return CopyToTensorParallel::apply(x, tp);
}
at::Tensor reduce_from_tensor_model_parallel_region(const at::Tensor& x,
                                                    const CommunicatorPtr& tp) {
  if (tp->size() == 1) return x;
  return ReduceFromTensorParallel::apply(x, tp);
}
at::Tensor scatter_to_tensor_model_parallel_region(const at::Tensor& x, const CommunicatorPtr& tp) {
  if (tp->size() == 1) return x;
  return ScatterToTensorParallel::apply(x, tp);
}
at::Tensor gather_from_tensor_model_parallel_region(const at::Tensor& x,
                                                    const CommunicatorPtr& tp) {
  if (tp->size() == 1) return x;
  return GatherFromTensorParallel::apply(x, tp);
}
at::Tensor scatter_to_sequence_parallel_region(const at::Tensor& x, const CommunicatorPtr& tp) {
  if (tp->size() == 1) return x;
  return ScatterToSequenceParallel::apply(x, tp);
}
at::Tensor gather_from_sequence_parallel_region(const at::Tensor& x, const CommunicatorPtr& tp,
                                                bool tensor_parallel_output_grad) {
  if (tp->size() == 1) return x;
  return GatherFromSequenceParallel::apply(x, tp, tensor_parallel_output_grad);
}
at::Tensor reduce_scatter_to_sequence_parallel_region(const at::Tensor& x,
                                                      const CommunicatorPtr& tp) {
  if (tp->size() == 1) return x;
  return ReduceScatterToSequenceParallel::apply(x, tp);
}

}  // namespace loom::model
