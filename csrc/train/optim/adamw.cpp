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
                          const at::Tensor& exp_avg_sq) {
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&param, &grad, &exp_avg, &exp_avg_sq}) {
    if (t->scalar_type() != at::kFloat)
      throw std::invalid_argument(std::string(what) + ": expected fp32 tensors, got " +
                                  std::string(c10::toString(t->scalar_type())));
    if (t->sizes() != param.sizes())
      throw std::invalid_argument(std::string(what) + ": tensor shapes differ from the parameter's");
  }
}

void check_step(const char* what, const AdamWStep& step) {
  if (!step.step.defined() || !step.skip.defined())
    throw std::invalid_argument(std::string(what) + ": the step count and skip flag must be tensors");
}

void check_host_step(const char* what, int64_t step) {
  if (step < 1) throw std::invalid_argument(std::string(what) + ": step must be >= 1, got " + std::to_string(step));
}

// The update's scalars as float64 0-dim device tensors. Unskipped, each equals the host double
// of the formula in adamw.h (the kernels then round it to fp32 as they would a host scalar);
// skipped, the decay factor and betas are 1 and the step size 0.
struct Factors {
  at::Tensor decay, beta1, beta2, bias_correction2_sqrt, neg_step_size;
};

Factors factors(const AdamWStep& s, const AdamWConfig& cfg) {
  const auto opts = s.step.options().dtype(at::kDouble);
  const at::Tensor skip = s.skip.to(at::kBool);
  const auto unless_skipped = [&](double value, double skipped) {
    return at::where(skip, at::scalar_tensor(skipped, opts), at::scalar_tensor(value, opts));
  };
  const at::Tensor t = s.step.to(at::kDouble).clamp_min(1.0);
  const at::Tensor bias_correction1 = 1.0 - at::pow(cfg.beta1, t);
  const at::Tensor bias_correction2 = 1.0 - at::pow(cfg.beta2, t);
  Factors f;
  f.decay = unless_skipped(1.0 - s.lr * cfg.weight_decay, 1.0);
  f.beta1 = unless_skipped(cfg.beta1, 1.0);
  f.beta2 = unless_skipped(cfg.beta2, 1.0);
  f.bias_correction2_sqrt = bias_correction2.sqrt();
  f.neg_step_size = at::where(skip, at::scalar_tensor(0.0, opts), at::scalar_tensor(-s.lr, opts) / bias_correction1);
  return f;
}

}  // namespace

AdamWStep adamw_step(int64_t step, double lr, at::Device device) {
  const auto opts = at::TensorOptions().device(device);
  return {lr, at::full({}, double(step), opts.dtype(at::kFloat)), at::zeros({}, opts.dtype(at::kBool))};
}

void adamw_update(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                  at::Tensor& exp_avg_sq, const AdamWStep& step, const AdamWConfig& cfg, bool decay) {
  check_update_tensors("adamw_update", param, grad, exp_avg, exp_avg_sq);
  check_step("adamw_update", step);
  const Factors f = factors(step, cfg);
  if (decay && cfg.weight_decay != 0.0) param.mul_(f.decay);
  exp_avg.mul_(f.beta1).add_(grad, 1.0 - cfg.beta1);
  exp_avg_sq.mul_(f.beta2).addcmul_(grad, grad, 1.0 - cfg.beta2);
  at::Tensor denom = (exp_avg_sq.sqrt() / f.bias_correction2_sqrt).add_(cfg.eps);
  // p + (step size · m) / denom: addcdiv's own order with the step size in the numerator.
  param.addcdiv_(exp_avg * f.neg_step_size, denom);
}

void adamw_update(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                  at::Tensor& exp_avg_sq, int64_t step, double lr, const AdamWConfig& cfg,
                  bool decay) {
  check_host_step("adamw_update", step);
  adamw_update(param, grad, exp_avg, exp_avg_sq, adamw_step(step, lr, param.device()), cfg, decay);
}

bool fused_adamw_supported(at::Device device) { return device.is_cuda(); }

void fused_adamw_update(AdamWTensors& t, const AdamWStep& step, const AdamWConfig& cfg, bool decay,
                        AdamWKernel kernel) {
  const size_t n = t.params.size();
  if (t.grads.size() != n || t.exp_avgs.size() != n || t.exp_avg_sqs.size() != n)
    throw std::invalid_argument("fused_adamw_update: the tensor lists differ in length");
  for (size_t k = 0; k < n; ++k)
    check_update_tensors("fused_adamw_update", t.params[k], t.grads[k], t.exp_avgs[k], t.exp_avg_sqs[k]);
  check_step("fused_adamw_update", step);
  if (n == 0) return;
  const at::Device device = t.params.front().device();
  if (kernel == AdamWKernel::kAuto)
    kernel = fused_adamw_supported(device) ? AdamWKernel::kAtenFused : AdamWKernel::kForEach;
  if (kernel == AdamWKernel::kAtenFused) {
    // The kernel reads the 1-based step from a float tensor per parameter (one shared here) and
    // returns without a change when found_inf is nonzero.
    const std::vector<at::Tensor> steps(n, step.step.clamp_min(1.0));
    at::_fused_adamw_(t.params, t.grads, t.exp_avgs, t.exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, step.lr, cfg.beta1,
                      cfg.beta2, decay ? cfg.weight_decay : 0.0, cfg.eps, /*amsgrad=*/false, /*maximize=*/false,
                      /*grad_scale=*/std::nullopt, /*found_inf=*/step.skip.to(at::kFloat));
    return;
  }
  // adamw_update's operations and factors, in its order, each over the whole list.
  const Factors f = factors(step, cfg);
  if (decay && cfg.weight_decay != 0.0) at::_foreach_mul_(t.params, f.decay);
  at::_foreach_mul_(t.exp_avgs, f.beta1);
  at::_foreach_add_(t.exp_avgs, t.grads, 1.0 - cfg.beta1);
  at::_foreach_mul_(t.exp_avg_sqs, f.beta2);
  at::_foreach_addcmul_(t.exp_avg_sqs, t.grads, t.grads, 1.0 - cfg.beta2);
  std::vector<at::Tensor> denom = at::_foreach_sqrt(t.exp_avg_sqs);
  at::_foreach_div_(denom, f.bias_correction2_sqrt);
  at::_foreach_add_(denom, cfg.eps);
  at::_foreach_addcdiv_(t.params, at::_foreach_mul(t.exp_avgs, f.neg_step_size), denom);
}

void fused_adamw_update(AdamWTensors& t, int64_t step, double lr, const AdamWConfig& cfg, bool decay,
                        AdamWKernel kernel) {
  check_host_step("fused_adamw_update", step);
  const at::Device device = t.params.empty() ? at::Device(at::kCPU) : t.params.front().device();
  fused_adamw_update(t, adamw_step(step, lr, device), cfg, decay, kernel);
}

}  // namespace loom::train::optim
