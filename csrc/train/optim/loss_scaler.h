// Dynamic loss scaling for fp16 training (trainer.precision=16), following NeMo's GradScaler
// with hysteresis (nemo/collections/nlp/parts/nlp_overrides.py) and its megatron_gpt defaults
// (native_amp_init_scale 2**32, native_amp_growth_interval 1000, hysteresis 2) with
// torch.amp.GradScaler's growth factor 2 and backoff factor 0.5.
//
// The loop multiplies the loss by scale() before backward; the optimizer step unscales the
// fp32 main gradients by 1/scale(), checks them for inf/NaN across all ranks, skips the update
// when any is found, and calls update(found_inf):
//   found_inf: growth tracker ← 0; hysteresis tracker −= 1; if it is now ≤ 0: scale ×= backoff.
//              (It stays ≤ 0 until a clean step, so further consecutive overflows keep backing off.)
//   clean:     hysteresis tracker ← hysteresis; growth tracker += 1; when it reaches
//              growth_interval: scale ×= growth (if the result is finite), growth tracker ← 0.
// The state lives on the run's device (0-dim tensors: the scale in float64, the trackers in
// int64) and update() takes the device's overflow flag, so a training step never waits for the
// device to decide (docs/design/devices.md, "Host waits"); scale() and the tracker accessors
// read it back (a wait: for logs, checkpoints and tests). State for checkpoints is plain JSON
// (doubles round-trip exactly).
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include <cstdint>

namespace loom::train::optim {

struct LossScalerConfig {
  double initial_scale = 4294967296.0;  ///< 2^32 (model.native_amp_init_scale)
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 1000;  ///< model.native_amp_growth_interval
  int64_t hysteresis = 2;          ///< model.hysteresis
};

class LossScaler {
 public:
  /// Throws std::invalid_argument naming the field for initial_scale <= 0, growth_factor <= 1,
  /// backoff_factor outside (0, 1), growth_interval < 1 or hysteresis < 1. The state lives on
  /// `device`.
  explicit LossScaler(LossScalerConfig cfg = {}, c10::Device device = c10::kCPU);

  /// The current scale: a float64 0-dim tensor on the device (what the loss is multiplied by).
  const at::Tensor& scale_tensor() const { return scale_; }
  /// Advances the state machine after one optimizer step (see the header comment) on the
  /// device: `found_inf` is a 0-dim bool tensor on the scaler's device, true when a gradient
  /// had an inf or NaN. No wait.
  void update(const at::Tensor& found_inf);
  /// update() with a host flag (tests).
  void update(bool found_inf);

  /// Host reads of the state (each waits for the device).
  double scale() const;
  int64_t growth_tracker() const;
  int64_t hysteresis_tracker() const;
  const LossScalerConfig& config() const { return cfg_; }

  /// {"scale", "growth_tracker", "hysteresis_tracker"} (waits for the device).
  nlohmann::json state_dict() const;
  /// Throws std::runtime_error naming the missing or mistyped key.
  void load_state_dict(const nlohmann::json& state);

 private:
  LossScalerConfig cfg_;
  c10::Device device_;
  at::Tensor scale_;               ///< float64 0-dim
  at::Tensor growth_tracker_;      ///< int64 0-dim
  at::Tensor hysteresis_tracker_;  ///< int64 0-dim
};

}  // namespace loom::train::optim
