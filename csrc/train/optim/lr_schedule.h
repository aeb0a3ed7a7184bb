// Learning-rate schedules of NeMo's `model.optim.sched` (nemo/core/optim/lr_scheduler.py),
// as a pure function of the step plus a small stateful counter for checkpoints.
//
// Step counting follows PyTorch's LR schedulers as NeMo drives them: the rate used by the
// k-th optimizer update (k = 0, 1, …, the trainer's global step) is lr_at(k); the scheduler
// steps on every training step, skipped fp16 steps included.
//
// W = warmup_steps, C = constant_steps, M = max_steps, D = M − C − W (decay steps).
// kCosine ("CosineAnnealing"):
//   C = 0: k ≤ W (W > 0): lr·(k+1)/(W+1); k > M: min_lr;
//          else min_lr + (lr − min_lr)·½(1 + cos(π·(k−W)/(M−W))).
//   C > 0 (Megatron-style warm-up, then a hold at min_lr for the last C steps):
//          k ≤ W (W > 0): lr·k/W; W+D < k: min_lr;
//          else min_lr + (lr − min_lr)·½(1 + cos(π·(k−W)/D)).
// kLinear ("WarmupAnnealing"):
//   C = 0: k ≤ W (W > 0): lr·(k+1)/(W+1); k > M: min_lr;
//          else min_lr + (lr − min_lr)·(1 − (k−W)/(M−W)).
//   C > 0 (Loom's extension, mirroring CosineAnnealing): k ≤ W: lr·k/W; W+D < k: min_lr;
//          else min_lr + (lr − min_lr)·(1 − (k−W)/D).
// kConstant ("WarmupPolicy"): k ≤ W (W > 0): lr·(k+1)/(W+1); k > M: min_lr; else lr.
// Note: NeMo's constant_steps hold the rate at min_lr *after* the decay, not at lr before it.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace loom::train::optim {

enum class LrDecay { kCosine, kLinear, kConstant };

/// Maps NeMo's scheduler names: "CosineAnnealing" → kCosine, "WarmupAnnealing" → kLinear,
/// "WarmupPolicy" / "constant" → kConstant. Throws std::invalid_argument naming `field` and the
/// accepted names otherwise.
LrDecay parse_lr_decay(const std::string& name, const std::string& field = "model.optim.sched.name");

struct LrScheduleConfig {
  double lr = 1e-4;         ///< model.optim.lr (peak)
  double min_lr = 0.0;      ///< model.optim.sched.min_lr
  int64_t warmup_steps = 0;    ///< model.optim.sched.warmup_steps
  int64_t constant_steps = 0;  ///< model.optim.sched.constant_steps
  int64_t max_steps = 1;       ///< trainer.max_steps
  LrDecay decay = LrDecay::kCosine;
};

/// Throws std::invalid_argument naming the field when lr < min_lr, a step count is negative,
/// max_steps < 1, or warmup_steps + constant_steps > max_steps.
void validate(const LrScheduleConfig& cfg);

/// The learning rate for optimizer step `step` (0-based). Validates `cfg`.
double lr_at(const LrScheduleConfig& cfg, int64_t step);

/// lr_at with a position: the rate for the next update is lr(); call advance() after each
/// training step (skipped or not). State for checkpoints: {"step": n}.
class LrScheduler {
 public:
  explicit LrScheduler(LrScheduleConfig cfg);
  double lr() const { return lr_at(cfg_, step_); }
  int64_t step() const { return step_; }
  void advance() { ++step_; }
  const LrScheduleConfig& config() const { return cfg_; }

  nlohmann::json state_dict() const;
  /// Throws std::runtime_error naming the key when "step" is missing or not a non-negative int.
  void load_state_dict(const nlohmann::json& state);

 private:
  LrScheduleConfig cfg_;
  int64_t step_ = 0;
};

}  // namespace loom::train::optim
