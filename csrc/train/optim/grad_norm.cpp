#include "train/optim/grad_norm.h"

#include <ATen/ATen.h>


namespace loom::train::optim {
namespace {

at::TensorOptions scalar_options(at::Device device) {
  return at::TensorOptions().dtype(at::kFloat).device(device);
}

}  // namespace

bool counts_in_grad_norm(const model::Param& param, int tensor_rank) {
  if (param.shared_duplicate) return false;
  return param.tensor_parallel() || tensor_rank == 0;
}

at::Tensor global_grad_norm(const std::vector<at::Tensor>& grads, runtime::Communicator& group,
                            at::Device device, bool multi_tensor) {
  at::Tensor sum_sq = at::zeros({1}, scalar_options(device));
  if (multi_tensor) {
    std::vector<at::Tensor> nonempty;
    for (const auto& g : grads)
      if (g.numel() > 0) nonempty.push_back(g);
    if (!nonempty.empty()) sum_sq.add_(at::stack(at::_foreach_norm(nonempty, 2)).square().sum());
  } else {
    for (const auto& g : grads) {
      if (g.numel() == 0) continue;
      at::Tensor n = at::linalg_vector_norm(g, 2, {}, false, at::kFloat);
      sum_sq.add_(n * n);
    }
  }
  group.all_reduce(sum_sq);
  return sum_sq.sqrt().reshape({});
}

at::Tensor clip_coefficient(const at::Tensor& norm, double max_norm) {
  const at::Tensor one = at::ones({}, norm.options().dtype(at::kDouble));
  if (!(max_norm > 0.0)) return one;
  // The host formula's float64 arithmetic on the fp32 norm, selected by finiteness.
  const at::Tensor n = norm.to(at::kDouble).reshape({});
  const at::Tensor coef = (max_norm / (n + 1e-6)).clamp_max(1.0);
  return at::where(at::isfinite(n), coef, one);
}

void scale_grads(const std::vector<at::Tensor>& grads, const at::Tensor& coefficient) {
  for (const auto& g : grads) g.mul_(coefficient);
}

at::Tensor found_inf_or_nan(const std::vector<at::Tensor>& grads, runtime::Communicator& group,
                            at::Device device) {
  at::Tensor flag = at::zeros({1}, scalar_options(device));
  for (const auto& g : grads) {
    if (g.numel() == 0) continue;
    flag.add_(at::logical_not(at::isfinite(g)).any().to(at::kFloat));
  }
  group.all_reduce(flag, runtime::ReduceOp::kMax);
  return (flag > 0.0f).reshape({});
}

}  // namespace loom::train::optim
