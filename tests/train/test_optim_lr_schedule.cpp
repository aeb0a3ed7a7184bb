// LR schedules against NeMo's formulas (nemo/core/optim/lr_scheduler.py): CosineAnnealing
// with and without constant_steps, WarmupAnnealing (linear), WarmupPolicy (constant), with
// step k = the 0-based optimizer step.
#include <catch2/catch.hpp>

#include <cmath>

#include "train/optim/lr_schedule.h"

using namespace loom::train::optim;

namespace {

LrScheduleConfig config(LrDecay decay, int64_t warmup, int64_t constant, int64_t max_steps) {
  LrScheduleConfig c;
  c.lr = 1.0;
  c.min_lr = 0.1;
  c.warmup_steps = warmup;
  c.constant_steps = constant;
  c.max_steps = max_steps;
  c.decay = decay;
  return c;
}

const double kPi = std::acos(-1.0);

}  // namespace

TEST_CASE("CosineAnnealing without constant_steps: (k+1)/(W+1) warm-up, cosine to max_steps", "[train][optim]") {
  auto c = config(LrDecay::kCosine, 4, 0, 14);
  CHECK(lr_at(c, 0) == Approx(0.2).epsilon(1e-15));
  CHECK(lr_at(c, 3) == Approx(0.8).epsilon(1e-15));
  CHECK(lr_at(c, 4) == 1.0);  // the last warm-up step reaches the peak
  // k = 5: a tenth of the decay: 0.1 + 0.9·½(1 + cos(0.1π)) = 0.977975432...
  CHECK(lr_at(c, 5) == Approx(0.1 + 0.45 * (1 + std::cos(0.1 * kPi))).epsilon(1e-15));
  CHECK(lr_at(c, 5) == Approx(0.9779754323).epsilon(1e-9));
  CHECK(lr_at(c, 9) == Approx(0.55).epsilon(1e-15));  // half way
  CHECK(lr_at(c, 14) == Approx(0.1).epsilon(1e-15));
  CHECK(lr_at(c, 15) == 0.1);
  CHECK(lr_at(c, 1000) == 0.1);
}

TEST_CASE("CosineAnnealing with constant_steps: k/W warm-up, decay over D, then min_lr", "[train][optim]") {
  auto c = config(LrDecay::kCosine, 4, 2, 14);  // D = 14 - 2 - 4 = 8
  CHECK(lr_at(c, 0) == 0.0);
  CHECK(lr_at(c, 2) == 0.5);
  CHECK(lr_at(c, 4) == 1.0);
  CHECK(lr_at(c, 6) == Approx(0.1 + 0.45 * (1 + std::cos(0.25 * kPi))).epsilon(1e-15));
  CHECK(lr_at(c, 8) == Approx(0.55).epsilon(1e-15));
  CHECK(lr_at(c, 12) == Approx(0.1).epsilon(1e-15));
  CHECK(lr_at(c, 13) == 0.1);  // the constant tail, at min_lr
  CHECK(lr_at(c, 14) == 0.1);
  CHECK(lr_at(c, 50) == 0.1);
}

TEST_CASE("Cosine without warm-up starts at the peak", "[train][optim]") {
  auto c = config(LrDecay::kCosine, 0, 0, 10);
  CHECK(lr_at(c, 0) == 1.0);
  CHECK(lr_at(c, 5) == Approx(0.55).epsilon(1e-15));
  CHECK(lr_at(c, 10) == Approx(0.1).epsilon(1e-15));
}

TEST_CASE("WarmupAnnealing: linear decay to min_lr", "[train][optim]") {
  auto c = config(LrDecay::kLinear, 4, 0, 14);
  CHECK(lr_at(c, 0) == Approx(0.2).epsilon(1e-15));
  CHECK(lr_at(c, 4) == 1.0);
  CHECK(lr_at(c, 6) == Approx(0.82).epsilon(1e-15));
  CHECK(lr_at(c, 9) == Approx(0.55).epsilon(1e-15));
  CHECK(lr_at(c, 14) == Approx(0.1).epsilon(1e-15));
  CHECK(lr_at(c, 15) == 0.1);
  auto h = config(LrDecay::kLinear, 4, 2, 14);  // with a constant tail
  CHECK(lr_at(h, 2) == 0.5);
  CHECK(lr_at(h, 8) == Approx(0.55).epsilon(1e-15));
  CHECK(lr_at(h, 13) == 0.1);
}

TEST_CASE("WarmupPolicy: constant after warm-up, min_lr after max_steps", "[train][optim]") {
  auto c = config(LrDecay::kConstant, 3, 0, 10);
  CHECK(lr_at(c, 0) == Approx(0.25).epsilon(1e-15));
  CHECK(lr_at(c, 3) == 1.0);
  CHECK(lr_at(c, 10) == 1.0);
  CHECK(lr_at(c, 11) == 0.1);
}

TEST_CASE("schedule names and invalid settings", "[train][optim]") {
  CHECK(parse_lr_decay("CosineAnnealing") == LrDecay::kCosine);
  CHECK(parse_lr_decay("WarmupAnnealing") == LrDecay::kLinear);
  CHECK(parse_lr_decay("WarmupPolicy") == LrDecay::kConstant);
  CHECK_THROWS_WITH(parse_lr_decay("Cosine"), Catch::Contains("model.optim.sched.name") && Catch::Contains("CosineAnnealing"));
  auto c = config(LrDecay::kCosine, 10, 5, 12);
  CHECK_THROWS_WITH(lr_at(c, 0), Catch::Contains("exceeds trainer.max_steps"));
  c = config(LrDecay::kCosine, 1, 0, 12);
  c.min_lr = 2.0;
  CHECK_THROWS_WITH(lr_at(c, 0), Catch::Contains("min_lr"));
  CHECK_THROWS(lr_at(config(LrDecay::kCosine, 1, 0, 12), -1));
}

TEST_CASE("LrScheduler advances one step per training step and round-trips its state", "[train][optim]") {
  LrScheduler s(config(LrDecay::kCosine, 4, 0, 14));
  CHECK(s.lr() == Approx(0.2).epsilon(1e-15));
  for (int i = 0; i < 9; ++i) s.advance();
  CHECK(s.step() == 9);
  CHECK(s.lr() == Approx(0.55).epsilon(1e-15));
  LrScheduler restored(config(LrDecay::kCosine, 4, 0, 14));
  restored.load_state_dict(nlohmann::json::parse(s.state_dict().dump()));
  CHECK(restored.step() == 9);
  CHECK(restored.lr() == s.lr());
  CHECK_THROWS_WITH(restored.load_state_dict({{"stp", 3}}), Catch::Contains("step"));
}
