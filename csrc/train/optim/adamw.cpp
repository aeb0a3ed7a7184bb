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

namespace {

void check_update_tensors(const char* what, const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                          const at::Tensor& exp_avg_sq, int64_t step) {
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&param, &grad, &exp_avg, &exp_avg_sq}) {
    if (t->scalar_type() != at::kFloat)
      throw std::invalid_argument(std::string(what) + ": expected fp32 tensors, got " +
                                  std::string(c10::toString(t->scalar_type())));
    if (t->sizes() != param.sizes())
      throw std::invalid_argument(std::string(what) + ": tensor shapes differ from the parameter's");
  }
  if (step < 1) throw std::invalid_argument(std::string(what) + ": step must be >= 1, got " + std::to_string(step));
}

}  // namespace

void adamw_update(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                  at::Tensor& exp_avg_sq, int64_t step, double lr, const AdamWConfig& cfg,
                  bool decay) {
  check_update_tensors("adamw_update", param, grad, exp_avg, exp_avg_sq, step);
  if (decay && cfg.weight_decay != 0.0) param.mul_(1.0 - lr * cfg.weight_decay);
  exp_avg.mul_(cfg.beta1).add_(grad, 1.0 - cfg.beta1);
  exp_avg_sq.mul_(cfg.beta2).addcmul_(grad, grad, 1.0 - cfg.beta2);
  const double bias_correction1 = 1.0 - std::pow(cfg.beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(cfg.beta2, static_cast<double>(step));
  at::Tensor denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(cfg.eps);
  param.addcdiv_(exp_avg, denom, -lr / bias_correction1);
}

bool fused_adamw_supported(at::Device device) { return device.is_cuda(); }

void fused_adamw_update(AdamWTensors& t, int64_t step, double lr, const AdamWConfig& cfg, bool decay,
                        AdamWKernel kernel) {
  const size_t n = t.params.size();
  if (t.grads.size() != n || t.exp_avgs.size() != n || t.exp_avg_sqs.size() != n)
    throw std::invalid_argument("fused_adamw_update: the tensor lists differ in length");
  for (size_t k = 0; k < n; ++k)
    check_update_tensors("fused_adamw_update", t.params[k], t.grads[k], t.exp_avgs[k], t.exp_avg_sqs[k], step);
  if (n == 0) return;
  const at::Device device = t.params.front().device();
  if (kernel == AdamWKernel::kAuto)
    kernel = fused_adamw_supported(device) ? AdamWKernel::kAtenFused : AdamWKernel::kForEach;
  if (kernel == AdamWKernel::kAtenFused) {
    // The kernel reads the 1-based step from a float tensor per parameter (one shared here).
    const at::Tensor step_t = at::full({}, double(step), at::TensorOptions().dtype(at::kFloat).device(device));
    const std::vector<at::Tensor> steps(n, step_t);
    at::_fused_adamw_(t.params, t.grads, t.exp_avgs, t.exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, cfg.beta1,
                      cfg.beta2, decay ? cfg.weight_decay : 0.0, cfg.eps, /*amsgrad=*/false, /*maximize=*/false);
    return;
  }
  // adamw_update's operations and scalars, in its order, each over the whole list.
  if (decay && cfg.weight_decay != 0.0) at::_foreach_mul_(t.params, 1.0 - lr * cfg.weight_decay);
  at::_foreach_mul_(t.exp_avgs, cfg.beta1);
  at::_foreach_add_(t.exp_avgs, t.grads, 1.0 - cfg.beta1);
  at::_foreach_mul_(t.exp_avg_sqs, cfg.beta2);
  at::_foreach_addcmul_(t.exp_avg_sqs, t.grads, t.grads, 1.0 - cfg.beta2);
  const double bias_correction1 = 1.0 - std::pow(cfg.beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(cfg.beta2, static_cast<double>(step));
  std::vector<at::Tensor> denom = at::_foreach_sqrt(t.exp_avg_sqs);
  at::_foreach_div_(denom, std::sqrt(bias_correction2));
  at::_foreach_add_(denom, cfg.eps);
  at::_foreach_addcdiv_(t.params, t.exp_avgs, denom, -lr / bias_correction1);
}

}  // namespace loom::train::optim
