#include "train/optim/lr_schedule.h"

#include <cmath>
#include <stdexcept>

namespace loom::train::optim {

LrDecay parse_lr_decay(const std::string& name, const std::string& field) {
  if (name == "CosineAnnealing") return LrDecay::kCosine;
  if (name == "WarmupAnnealing") return LrDecay::kLinear;
  if (name == "WarmupPolicy" || name == "constant") return LrDecay::kConstant;
  throw std::invalid_argument(field + ": unknown scheduler '" + name +
                              "'; expected CosineAnnealing, WarmupAnnealing, WarmupPolicy or constant");
}

void validate(const LrScheduleConfig& c) {
  auto fail = [](const std::string& msg) { throw std::invalid_argument("LR schedule: " + msg); };
  if (!(c.lr >= 0.0)) fail("model.optim.lr must be >= 0, got " + std::to_string(c.lr));
  if (!(c.min_lr >= 0.0) || c.min_lr > c.lr)
    fail("model.optim.sched.min_lr must be in [0, lr=" + std::to_string(c.lr) + "], got " +
         std::to_string(c.min_lr));
  if (c.warmup_steps < 0) fail("model.optim.sched.warmup_steps must be >= 0");
  if (c.constant_steps < 0) fail("model.optim.sched.constant_steps must be >= 0");
  if (c.max_steps < 1) fail("trainer.max_steps must be >= 1, got " + std::to_string(c.max_steps));
  if (c.warmup_steps + c.constant_steps > c.max_steps)
    fail("warmup_steps + constant_steps (" + std::to_string(c.warmup_steps + c.constant_steps) +
         ") exceeds trainer.max_steps (" + std::to_string(c.max_steps) + ")");
}

namespace {

const double kPi = std::acos(-1.0);

// Fraction of the peak-to-min distance still left after `done` of `total` decay steps.
double decay_coefficient(LrDecay decay, double done, double total) {
  double ratio = total > 0 ? done / total : 1.0;
  if (decay == LrDecay::kCosine) return 0.5 * (1.0 + std::cos(kPi * ratio));
  return 1.0 - ratio;  // linear
}

}  // namespace

double lr_at(const LrScheduleConfig& c, int64_t step) {
  validate(c);
  if (step < 0) throw std::invalid_argument("lr_at: step must be >= 0, got " + std::to_string(step));
  const int64_t W = c.warmup_steps, C = c.constant_steps, M = c.max_steps;
  const double k = static_cast<double>(step);
  if (c.decay == LrDecay::kConstant || C == 0) {
    // NeMo's WarmupPolicy family: warm-up reaches lr at step W, min_lr after max_steps.
    if (W > 0 && step <= W) return c.lr * (k + 1.0) / (static_cast<double>(W) + 1.0);
    if (step > M) return c.min_lr;
    if (c.decay == LrDecay::kConstant) return c.lr;
    return c.min_lr + (c.lr - c.min_lr) * decay_coefficient(c.decay, k - W, double(M - W));
  }
  // constant_steps > 0: Megatron-style warm-up from 0, decay over D, then min_lr.
  const int64_t D = M - C - W;
  if (W > 0 && step <= W) return c.lr * k / static_cast<double>(W);
  if (step > W + D) return c.min_lr;
  return c.min_lr + (c.lr - c.min_lr) * decay_coefficient(c.decay, k - W, double(D));
}

LrScheduler::LrScheduler(LrScheduleConfig cfg) : cfg_(cfg) { validate(cfg_); }

nlohmann::json LrScheduler::state_dict() const { return {{"step", step_}}; }

void LrScheduler::load_state_dict(const nlohmann::json& state) {
  if (!state.is_object() || !state.contains("step") || !state["step"].is_number_integer() ||
      state["step"].get<int64_t>() < 0) {
    throw std::runtime_error("LR scheduler state: expected {\"step\": <non-negative integer>}, got " +
                             state.dump());
  }
  step_ = state["step"].get<int64_t>();
}

}  // namespace loom::train::optim
