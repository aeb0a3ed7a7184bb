// The plain optimizer (model.optim.name: fused_adam): every data-parallel rank all-reduces the
// whole gradient and updates the whole model. fp32 models are updated in place (the parameters
// are the main parameters); bf16/fp16 models keep fp32 main copies that are rounded into the
// parameters after each update. See optimizer.h.
// Optimizer::create, which builds it or the distributed one (distributed_optimizer.h), is here too.
#include <ATen/ATen.h>

#include "train/optim/distributed_optimizer.h"
#include "train/optim/optimizer.h"

namespace loom::train::optim {
namespace {

class PlainOptimizer final : public Optimizer {
 public:
  PlainOptimizer(model::ParamList params, std::shared_ptr<runtime::ProcessGroups> groups, OptimizerOptions options)
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

 protected:
  void publish_params(bool /*async: nothing to gather*/) override {
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

  std::vector<at::Tensor> gather_state(int kind) override {
    std::vector<at::Tensor> out;
    for (auto& piece : pieces_) {
      const at::Tensor& t = kind == 0 ? piece.main : kind == 1 ? piece.exp_avg : piece.exp_avg_sq;
      out.push_back(t.clone());
    }
    return out;
  }
};

}  // namespace

std::unique_ptr<Optimizer> Optimizer::create(model::ParamList params,
                                             std::shared_ptr<runtime::ProcessGroups> groups,
                                             OptimizerOptions options) {
  if (options.distributed)
    return std::make_unique<DistributedOptimizer>(std::move(params), std::move(groups), options);
  return std::make_unique<PlainOptimizer>(std::move(params), std::move(groups), options);
}

}  // namespace loom::train::optim
