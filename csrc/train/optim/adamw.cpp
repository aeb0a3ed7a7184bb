#include "train/optim/adamw.h"

#include <ATen/ATen.h>

#include <cmath>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace loom::train::optim {

void validate(const AdamWConfig& c) {
  if (!(c.beta1 >= 0.0 && c.beta1 < 1.0))
    throw std::invalid_argument("model.optim.betas[0] must be in [0, 1), got " + std::to_string(c.beta1));
  if (!(c.beta2 >= 0.0 && c.beta2 < 1.0))
    throw std::invalid_argument("model.optim.betas[1] must be in [0, 1), got " + std::to_string(c.beta2));
  if (!(c.eps > 0.0)) throw std::invalid_argument("model.optim.eps must be > 0, got " + std::to_string(c.eps));
  if (!(c.weight_decay >= 0.0))
    throw std::invalid_argument("model.optim.weight_decay must be >= 0, got " + std::to_string(c.weight_decay));
}

void adamw_update(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                  at::Tensor& exp_avg_sq, int64_t step, double lr, const AdamWConfig& cfg,
                  bool decay) {
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&param, &grad, &exp_avg, &exp_avg_sq}) {
    if (t->scalar_type() != at::kFloat)
      throw std::invalid_argument("adamw_update: expected fp32 tensors, got " +
                                  std::string(c10::toString(t->scalar_type())));
    if (t->sizes() != param.sizes())
      throw std::invalid_argument("adamw_update: tensor shapes differ from the parameter's");
  }
  if (step < 1) throw std::invalid_argument("adamw_update: step must be >= 1, got " + std::to_string(step));
  if (decay && cfg.weight_decay != 0.0) param.mul_(1.0 - lr * cfg.weight_decay);
  exp_avg.mul_(cfg.beta1).add_(grad, 1.0 - cfg.beta1);
  exp_avg_sq.mul_(cfg.beta2).addcmul_(grad, grad, 1.0 - cfg.beta2);
  const double bias_correction1 = 1.0 - std::pow(cfg.beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(cfg.beta2, static_cast<double>(step));
  at::Tensor denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(cfg.eps);
  param.addcdiv_(exp_avg, denom, -lr / bias_correction1);
}

}  // namespace loom::train::optim
