#include "train/optim/loss_scaler.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace loom::train::optim {

LossScaler::LossScaler(LossScalerConfig cfg) : cfg_(cfg) {
  auto fail = [](const std::string& msg) { throw std::invalid_argument("loss scaler: " + msg); };
  if (!(cfg_.initial_scale > 0.0) || !std::isfinite(cfg_.initial_scale))
    fail("initial_scale must be finite and > 0, got " + std::to_string(cfg_.initial_scale));
  if (!(cfg_.growth_factor > 1.0)) fail("growth_factor must be > 1, got " + std::to_string(cfg_.growth_factor));
  if (!(cfg_.backoff_factor > 0.0 && cfg_.backoff_factor < 1.0))
    fail("backoff_factor must be in (0, 1), got " + std::to_string(cfg_.backoff_factor));
  if (cfg_.growth_interval < 1) fail("growth_interval must be >= 1, got " + std::to_string(cfg_.growth_interval));
  if (cfg_.hysteresis < 1) fail("hysteresis must be >= 1, got " + std::to_string(cfg_.hysteresis));
  scale_ = cfg_.initial_scale;
  hysteresis_tracker_ = cfg_.hysteresis;
}

void LossScaler::update(bool found_inf) {
  if (found_inf) {
    growth_tracker_ = 0;
    if (--hysteresis_tracker_ <= 0) scale_ *= cfg_.backoff_factor;
    return;
  }
  hysteresis_tracker_ = cfg_.hysteresis;
  if (++growth_tracker_ == cfg_.growth_interval) {
    double grown = scale_ * cfg_.growth_factor;
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  }
}

nlohmann::json LossScaler::state_dict() const {
  return {{"scale", scale_}, {"growth_tracker", growth_tracker_}, {"hysteresis_tracker", hysteresis_tracker_}};
}

void LossScaler::load_state_dict(const nlohmann::json& s) {
  auto need = [&](const char* key, bool ok) {
    if (!s.is_object() || !s.contains(key) || !ok)
      throw std::runtime_error(std::string("loss scaler state: missing or invalid '") + key + "' in " + s.dump());
  };
  need("scale", s.contains("scale") && s["scale"].is_number() && s["scale"].get<double>() > 0);
  need("growth_tracker", s.contains("growth_tracker") && s["growth_tracker"].is_number_integer());
  need("hysteresis_tracker", s.contains("hysteresis_tracker") && s["hysteresis_tracker"].is_number_integer());
  scale_ = s["scale"].get<double>();
  growth_tracker_ = s["growth_tracker"].get<int64_t>();
  hysteresis_tracker_ = s["hysteresis_tracker"].get<int64_t>();
}

}  // namespace loom::train::optim
