// The engine's paging, chunked prefill, prefix caching and n-gram speculation together on the
// stand-in device (the GPU code path on CPU): the tokens and log-probabilities of CPU requests
// served one at a time.
#include <catch2/catch.hpp>

#include "generate/generate_test_util.h"
#include "harness/standin_device.h"
#include "runtime/run_device.h"
#include "serve/engine.h"
#include "serve/engine_test_util.h"

using namespace loom;
using namespace loom::serve::engine_test;

TEST_CASE("Engine on the stand-in device: chunked prefill with prefix caching and speculation gives the CPU tokens", "[standin]") {
  test::use_standin_device();
  const auto device = runtime::select_run_device(runtime::DeviceKind::kAccelerator, 0).device;
  REQUIRE(device.type() == c10::DeviceType::PrivateUse1);
  const auto c = generate::test::tiny_config();
  const auto specs = shared_prefix_specs(c);
  const auto reference = one_at_a_time(truth_stage(c), specs);

  const auto tp = runtime::Communicator::solo(0, device);
  model::GptStage stage(c, tp, {}, device);
  generate::test::set_truth(stage, 0, 1);
  serve::EngineOptions options;
  options.max_batch = 3;
  options.max_num_batched_tokens = 5;  // prompts of 12-14 tokens: prefilled in chunks beside decodes
  options.block_size = 4;              // the 10-token shared prefix: two full blocks to reuse
  options.speculative.method = serve::SpeculativeMethod::kNgram;
  options.speculative.num_tokens = 3;
  options.speculative.prompt_lookup_min = 1;
  options.speculative.prompt_lookup_max = 3;
  serve::GenerationEngine engine(stage, solo_groups(tp), options);
  int64_t largest_step = 0;
  const auto got = drive(engine, specs, {0, 0, 1, 3, 6, 9}, true,
                         [&](int) { largest_step = std::max(largest_step, engine.last_step_tokens()); });
  for (size_t i = 0; i < specs.size(); ++i) {
    INFO("request " << i);
    require_same(got[i], reference[i]);
  }
  CHECK(largest_step <= 5);
  CHECK(engine.prefix_cache_stats().hit_tokens > 0);
  CHECK(engine.drafted_tokens() > 0);
  CHECK(engine.accepted_tokens() > 0);
}
