#include "train/optim/loss_scaler.h"

#include <ATen/ATen.h>

#include <cmath>
#include <stdexcept>
#include <string>

namespace loom::train::optim {

namespace {

at::Tensor device_scalar(c10::Scalar value, at::ScalarType dtype, c10::Device device) {
  return at::full({}, value, at::TensorOptions().dtype(dtype).device(device));
}

}  // namespace

LossScaler::LossScaler(LossScalerConfig cfg, c10::Device device) : cfg_(cfg), device_(device) {
  auto fail = [](const std::string& msg) { throw std::invalid_argument("loss scaler: " + msg); };
  if (!(cfg_.initial_scale > 0.0) || !std::isfinite(cfg_.initial_scale))
    fail("initial_scale must be finite and > 0, got " + std::to_string(cfg_.initial_scale));
  if (!(cfg_.growth_factor > 1.0)) fail("growth_factor must be > 1, got " + std::to_string(cfg_.growth_factor));
  if (!(cfg_.backoff_factor > 0.0 && cfg_.backoff_factor < 1.0))
    fail("backoff_factor must be in (0, 1), got " + std::to_string(cfg_.backoff_factor));
  if (cfg_.growth_interval < 1) fail("growth_interval must be >= 1, got " + std::to_string(cfg_.growth_interval));
  if (cfg_.hysteresis < 1) fail("hysteresis must be >= 1, got " + std::to_string(cfg_.hysteresis));
  scale_ = device_scalar(cfg_.initial_scale, at::kDouble, device_);
  growth_tracker_ = device_scalar(0, at::kLong, device_);
  hysteresis_tracker_ = device_scalar(cfg_.hysteresis, at::kLong, device_);
}

// The header's state machine as branch-free device ops: both outcomes are computed and the
// flag selects (the values are exact: integers, and the scale times powers of the factors).
void LossScaler::update(const at::Tensor& found_inf) {
  const at::Tensor found = found_inf.to(device_, at::kBool).reshape({});
  const at::Tensor clean = found.logical_not();
  const at::Tensor zero = at::zeros_like(growth_tracker_);
  hysteresis_tracker_ = at::where(found, hysteresis_tracker_ - 1, at::full_like(hysteresis_tracker_, cfg_.hysteresis));
  const at::Tensor back_off = found.logical_and(hysteresis_tracker_ <= 0);
  at::Tensor scale = at::where(back_off, scale_ * cfg_.backoff_factor, scale_);
  at::Tensor growth = at::where(found, zero, growth_tracker_ + 1);
  const at::Tensor grow = clean.logical_and(growth == cfg_.growth_interval);
  const at::Tensor grown = scale * cfg_.growth_factor;
  scale_ = at::where(grow.logical_and(at::isfinite(grown)), grown, scale);
  growth_tracker_ = at::where(grow, zero, growth);
}

void LossScaler::update(bool found_inf) {
  update(at::full({}, found_inf, at::TensorOptions().dtype(at::kBool).device(device_)));
}

double LossScaler::scale() const { return scale_.item<double>(); }
int64_t LossScaler::growth_tracker() const { return growth_tracker_.item<int64_t>(); }
int64_t LossScaler::hysteresis_tracker() const { return hysteresis_tracker_.item<int64_t>(); }

nlohmann::json LossScaler::state_dict() const {
  return {{"scale", scale()}, {"growth_tracker", growth_tracker()}, {"hysteresis_tracker", hysteresis_tracker()}};
}

void LossScaler::load_state_dict(const nlohmann::json& s) {
  auto need = [&](const char* key, bool ok) {
    if (!s.is_object() || !s.contains(key) || !ok)
      throw std::runtime_error(std::string("loss scaler state: missing or invalid '") + key + "' in " + s.dump());
  };
  need("scale", s.contains("scale") && s["scale"].is_number() && s["scale"].get<double>() > 0);
  need("growth_tracker", s.contains("growth_tracker") && s["growth_tracker"].is_number_integer());
  need("hysteresis_tracker", s.contains("hysteresis_tracker") && s["hysteresis_tracker"].is_number_integer());
  scale_ = device_scalar(s["scale"].get<double>(), at::kDouble, device_);
  growth_tracker_ = device_scalar(s["growth_tracker"].get<int64_t>(), at::kLong, device_);
  hysteresis_tracker_ = device_scalar(s["hysteresis_tracker"].get<int64_t>(), at::kLong, device_);
}

}  // namespace loom::train::optim
