#include "train/optim/plain_optimizer.h"

#include <ATen/ATen.h>

namespace loom::train::optim {

PlainOptimizer::PlainOptimizer(model::ParamList params, std::shared_ptr<runtime::ProcessGroups> groups,
                               OptimizerOptions options)
    : Optimizer(std::move(params), std::move(groups), options) {
  options_.distributed = false;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor p = params_[i].tensor.detach();
    Piece piece;
    piece.param = i;
    piece.numel = p.numel();
    piece.main_is_param = p.scalar_type() == at::kFloat;
    piece.main = piece.main_is_param ? p : at::empty(p.sizes(), p.options().dtype(at::kFloat));
    piece.grad = grads_->main_grad(i);
    piece.exp_avg = at::zeros(p.sizes(), p.options().dtype(at::kFloat));
    piece.exp_avg_sq = at::zeros(p.sizes(), p.options().dtype(at::kFloat));
    pieces_.push_back(std::move(piece));
  }
  init_main_from_params();
}

void PlainOptimizer::publish_params(bool /*async: nothing to gather*/) {
  at::NoGradGuard no_grad;
  if (options_.fused_adamw && grads_->data().device().is_cuda()) {
    // One multi-tensor copy (fp32 → bf16/fp16) for all model copies.
    std::vector<at::Tensor> model, main;
    for (auto& piece : pieces_) {
      if (piece.main_is_param) continue;
      model.push_back(params_[piece.param].tensor.detach());
      main.push_back(piece.main);
    }
    if (!model.empty()) at::_foreach_copy_(model, main);
    return;
  }
  for (auto& piece : pieces_) {
    if (!piece.main_is_param) params_[piece.param].tensor.detach().copy_(piece.main);
  }
}

std::vector<at::Tensor> PlainOptimizer::gather_state(int kind) {
  std::vector<at::Tensor> out;
  for (auto& piece : pieces_) {
    const at::Tensor& t = kind == 0 ? piece.main : kind == 1 ? piece.exp_avg : piece.exp_avg_sq;
    out.push_back(t.clone());
  }
  return out;
}

}  // namespace loom::train::optim
