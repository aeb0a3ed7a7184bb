// Dynamic loss scaling: NeMo's GradScaler state machine with hysteresis and its defaults.
#include <catch2/catch.hpp>

#include "train/optim/loss_scaler.h"

using namespace loom::train::optim;

TEST_CASE("loss scaler defaults follow NeMo's megatron_gpt config", "[train][optim]") {
  LossScaler s;
  CHECK(s.scale() == 4294967296.0);  // 2^32
  CHECK(s.config().growth_interval == 1000);
  CHECK(s.config().hysteresis == 2);
  CHECK(s.config().growth_factor == 2.0);
  CHECK(s.config().backoff_factor == 0.5);
}

TEST_CASE("hysteresis: the scale backs off only after consecutive overflows", "[train][optim]") {
  LossScalerConfig c;
  c.initial_scale = 1024;
  LossScaler s(c);  // hysteresis 2
  s.update(true);
  CHECK(s.scale() == 1024);
  s.update(true);
  CHECK(s.scale() == 512);
  s.update(true);  // still out of hysteresis: backs off again
  CHECK(s.scale() == 256);
  s.update(false);  // a clean step restores the hysteresis budget
  CHECK(s.hysteresis_tracker() == 2);
  s.update(true);
  CHECK(s.scale() == 256);
  s.update(false);
  s.update(true);  // inf, clean, inf: not consecutive, no backoff
  CHECK(s.scale() == 256);

  c.hysteresis = 1;
  LossScaler h1(c);
  h1.update(true);
  CHECK(h1.scale() == 512);
}

TEST_CASE("the scale grows after growth_interval clean steps, an overflow restarts the count", "[train][optim]") {
  LossScalerConfig c;
  c.initial_scale = 65536;
  c.hysteresis = 1;
  LossScaler s(c);
  for (int i = 0; i < 999; ++i) s.update(false);
  CHECK(s.scale() == 65536);
  CHECK(s.growth_tracker() == 999);
  s.update(false);
  CHECK(s.scale() == 131072);
  CHECK(s.growth_tracker() == 0);
  for (int i = 0; i < 500; ++i) s.update(false);
  s.update(true);  // backs off and resets the growth tracker
  CHECK(s.scale() == 65536);
  CHECK(s.growth_tracker() == 0);
  for (int i = 0; i < 999; ++i) s.update(false);
  CHECK(s.scale() == 65536);
  s.update(false);
  CHECK(s.scale() == 131072);
}

TEST_CASE("loss scaler state round trip and invalid settings", "[train][optim]") {
  LossScalerConfig c;
  c.growth_interval = 3;
  LossScaler s(c);
  s.update(true);
  s.update(true);
  s.update(false);
  LossScaler r(c);
  r.load_state_dict(nlohmann::json::parse(s.state_dict().dump()));
  CHECK(r.scale() == s.scale());
  CHECK(r.growth_tracker() == s.growth_tracker());
  CHECK(r.hysteresis_tracker() == s.hysteresis_tracker());
  for (bool inf : {false, false, true, true, false}) {
    s.update(inf);
    r.update(inf);
    CHECK(r.scale() == s.scale());
  }
  CHECK_THROWS_WITH(r.load_state_dict({{"scale", 2.0}}), Catch::Contains("growth_tracker"));
  c.backoff_factor = 1.5;
  CHECK_THROWS_WITH(LossScaler(c), Catch::Contains("backoff_factor"));
  c.backoff_factor = 0.5;
  c.hysteresis = 0;
  CHECK_THROWS_WITH(LossScaler(c), Catch::Contains("hysteresis"));
}
