// Fixed-shape decode steps (serve/decode_graphs.h, docs/serving.md "Decode graphs"): the
// buckets and the choice of a step's bucket; with the runner forced on, concurrent greedy and
// seeded sampled requests give exactly the tokens (and the log-probabilities within fp32
// rounding) of the runner off, at t = 1 on CPU through buckets 1, 2, 4, 8 and 12 with padding,
// at t = 2, and on the stand-in device, where the region from the filled inputs to the ready
// logits waits for the device zero times (what a CUDA graph capture needs; the capture itself
// runs on CUDA only).
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <fstream>

#include "generate/generate_test_util.h"
#include "harness/multiprocess.h"
#include "harness/standin_device.h"
#include "harness/worker_groups.h"
#include "runtime/run_device.h"
#include "serve/decode_graphs.h"
#include "serve/engine.h"
#include "serve/engine_test_util.h"

using namespace loom;
using namespace loom::generate::test;
using namespace loom::serve::engine_test;
using serve::DecodeGraphMode;

namespace {

// Fourteen requests, greedy and seeded sampled, prompts of 1 to 12 tokens, joining over the
// first steps, so that the decode-only steps hold 1 to 12 requests.
std::vector<RequestSpec> mixed_specs(const model::GptConfig& c) {
  std::vector<RequestSpec> specs = greedy_specs(c);
  const auto sampled = sampled_specs(c);
  specs.insert(specs.end(), sampled.begin(), sampled.end());
  for (int64_t i = 0; i < 2; ++i) {
    RequestSpec s = greedy_specs(c)[static_cast<size_t>(i)];
    s.max_new_tokens = 11 + i;
    s.prompt_logprobs = false;
    specs.push_back(s);
  }
  return specs;
}

std::vector<int> join_steps(size_t n) {
  std::vector<int> after;
  for (size_t i = 0; i < n; ++i) after.push_back(i < 9 ? 0 : static_cast<int>(3 * i - 20));
  return after;
}

struct Run {
  std::vector<Outcome> outcomes;
  std::optional<serve::DecodeGraphStats> stats;
};

Run run_engine(const model::GptStage& stage, const runtime::CommunicatorPtr& tp, DecodeGraphMode mode,
               int64_t max_batch) {
  serve::EngineOptions options;
  options.max_batch = max_batch;
  options.decode_graphs = mode;
  serve::GenerationEngine engine(stage, solo_groups(tp), options);
  const auto specs = mixed_specs(stage.config());
  Run run;
  run.outcomes = drive(engine, specs, join_steps(specs.size()));
  if (engine.decode_graphs() != nullptr) run.stats = engine.decode_graphs()->stats();
  return run;
}

void require_same_runs(const std::vector<Outcome>& got, const std::vector<Outcome>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("request " << i);
    require_same(got[i], want[i]);
  }
}

}  // namespace

TEST_CASE("Decode graphs: the buckets of a max batch and the bucket of a step") {
  using V = std::vector<int64_t>;
  CHECK(serve::decode_graph_buckets(1) == V{1});
  CHECK(serve::decode_graph_buckets(3) == V{1, 2, 3});
  CHECK(serve::decode_graph_buckets(8) == V{1, 2, 4, 8});
  CHECK(serve::decode_graph_buckets(12) == V{1, 2, 4, 8, 12});
  CHECK(serve::decode_graph_buckets(16) == V{1, 2, 4, 8, 16});
  CHECK(serve::decode_graph_buckets(33) == V{1, 2, 4, 8, 16, 24, 32, 33});
  const V buckets = serve::decode_graph_buckets(20);
  CHECK(buckets == V{1, 2, 4, 8, 16, 20});
  const std::vector<std::pair<int64_t, int64_t>> rows_bucket{{1, 1}, {2, 2}, {3, 4}, {5, 8}, {8, 8},
                                                             {9, 16}, {16, 16}, {17, 20}, {20, 20}};
  for (auto [rows, bucket] : rows_bucket) {
    INFO(rows << " rows");
    CHECK(serve::decode_graph_bucket(buckets, rows) == bucket);
  }
  CHECK_THROWS_AS(serve::decode_graph_bucket(buckets, 21), std::out_of_range);
  CHECK_THROWS_AS(serve::decode_graph_bucket(buckets, 0), std::out_of_range);
  CHECK_THROWS_AS(serve::decode_graph_buckets(0), std::invalid_argument);
  CHECK(serve::parse_decode_graph_mode("auto") == DecodeGraphMode::kAuto);
  CHECK(serve::parse_decode_graph_mode("on") == DecodeGraphMode::kOn);
  CHECK(serve::parse_decode_graph_mode("off") == DecodeGraphMode::kOff);
  CHECK_THROWS_WITH(serve::parse_decode_graph_mode("yes"),
                    Catch::Matchers::Contains("--cuda-graphs: expected auto, on or off, found 'yes'"));
}

TEST_CASE("Decode graphs: forced on at t=1 on CPU, every bucket gives the tokens of the runner off") {
  const auto c = tiny_config();
  const auto stage = truth_stage(c);
  const auto tp = runtime::Communicator::solo();
  const Run off = run_engine(stage, tp, DecodeGraphMode::kOff, 12);
  REQUIRE_FALSE(off.stats.has_value());
  REQUIRE_FALSE(run_engine(stage, tp, DecodeGraphMode::kAuto, 12).stats.has_value());  // auto: CUDA only
  const Run on = run_engine(stage, tp, DecodeGraphMode::kOn, 12);
  require_same_runs(on.outcomes, off.outcomes);
  REQUIRE(on.stats.has_value());
  const auto& s = *on.stats;
  CHECK(s.captures == 0);
  CHECK_FALSE(s.region_host_waits.has_value());  // nothing counts on the CPU
  CHECK(s.padded_rows > 0);
  INFO("steps by bucket: " << nlohmann::json(s.steps_by_bucket).dump());
  for (int64_t bucket : {1, 2, 4, 8, 12}) CHECK(s.steps_by_bucket.count(bucket) == 1);
  // And against each request alone (one row, bucket 1 every step).
  const auto specs = mixed_specs(c);
  serve::EngineOptions alone_options;
  alone_options.decode_graphs = DecodeGraphMode::kOn;
  require_same_runs(on.outcomes, one_at_a_time(stage, specs, alone_options));
}

namespace {

// Worker: the mixed requests at t = LOOM_T with the runner LOOM_GRAPHS (on/off); rank 0 writes
// the outcomes and the steps that ran at a bucket.
void graphs_worker() {
  const int t = test::env_int("LOOM_T");
  auto groups = test::worker_groups(t, 1);
  const auto c = tiny_config();
  model::GptStage stage(c, groups->tensor_ptr());
  set_truth(stage, groups->coords().tp, t);
  serve::EngineGroups eg{groups->tensor_ptr(), &groups->pipeline_links(), &groups->host_world(), 0};
  serve::EngineOptions options;
  options.max_batch = 12;
  options.decode_graphs = serve::parse_decode_graph_mode(test::env_str("LOOM_GRAPHS"));
  serve::GenerationEngine engine(stage, eg, options);
  const auto specs = mixed_specs(c);
  const bool serving = groups->rank() == 0;
  const auto out = drive(engine, specs, join_steps(specs.size()), serving);
  if (serving) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& o : out) j.push_back(outcome_json(o));
    const int64_t steps = engine.decode_graphs() ? engine.decode_graphs()->stats().steps : 0;
    std::ofstream(test::env_str("LOOM_OUT")) << nlohmann::json{{"outcomes", j}, {"bucket_steps", steps}}.dump();
  }
  groups->shutdown();
}

}  // namespace

LOOM_WORKER("serve_decode_graphs") { graphs_worker(); }

TEST_CASE("Decode graphs: forced on at t=2 gives the t=1 tokens of the runner off") {
  const auto c = tiny_config();
  const auto stage = truth_stage(c);
  const Run reference = run_engine(stage, runtime::Communicator::solo(), DecodeGraphMode::kOff, 12);
  const std::string dir = temp_dir("serve_decode_graphs");
  const std::string out = dir + "/out.json";
  auto result = test::run_ranks("serve_decode_graphs", 2, {{"LOOM_T", "2"}, {"LOOM_GRAPHS", "on"}, {"LOOM_OUT", out}});
  REQUIRE(result.exit_code() == 0);
  nlohmann::json j;
  std::ifstream(out) >> j;
  CHECK(j.at("bucket_steps").get<int64_t>() > 0);
  std::vector<Outcome> got;
  for (const auto& o : j.at("outcomes")) got.push_back(outcome_from_json(o));
  require_same_runs(got, reference.outcomes);
  launch::remove_tree(dir);
}

TEST_CASE("Decode graphs: on the stand-in device the bucketed forward never waits for the device", "[standin]") {
  test::use_standin_device();
  const auto device = runtime::select_run_device(runtime::DeviceKind::kAccelerator, 0).device;
  REQUIRE(device.type() == c10::DeviceType::PrivateUse1);
  const auto c = tiny_config();
  const auto cpu_stage = truth_stage(c);
  const Run reference = run_engine(cpu_stage, runtime::Communicator::solo(), DecodeGraphMode::kOff, 12);

  const auto tp = runtime::Communicator::solo(0, device);
  model::GptStage stage(c, tp, {}, device);
  set_truth(stage, 0, 1);
  // auto stays off on a device that is not CUDA; on runs the buckets eagerly.
  REQUIRE_FALSE(run_engine(stage, tp, DecodeGraphMode::kAuto, 12).stats.has_value());
  const std::optional<int64_t> waits_before = runtime::device_host_waits();
  REQUIRE(waits_before.has_value());
  const Run on = run_engine(stage, tp, DecodeGraphMode::kOn, 12);
  require_same_runs(on.outcomes, reference.outcomes);
  REQUIRE(on.stats.has_value());
  const auto& s = *on.stats;
  CHECK(s.steps > 10);
  CHECK(s.steps_by_bucket.size() >= 4);
  // The counter counts (the steps read their chosen tokens back), and none of it is in the region.
  CHECK(*runtime::device_host_waits() - *waits_before > s.steps);
  REQUIRE(s.region_host_waits.has_value());
  CHECK(*s.region_host_waits == 0);
}

// Hidden (run by name on a GPU host: `loom_test_serve "[cuda]"`, docs/serving.md "Decode
// graphs"): on CUDA, auto captures one graph per bucket used, and the replayed graphs give the
// tokens of eager steps.
TEST_CASE("Decode graphs: on CUDA the captured graphs give the tokens of eager steps", "[.cuda]") {
  REQUIRE(at::hasCUDA());
  const at::Device device(at::kCUDA, 0);
  const auto c = tiny_config();
  const auto tp = runtime::Communicator::solo(0, device);
  model::GptStage stage(c, tp, {}, device);
  set_truth(stage, 0, 1);
  const Run eager = run_engine(stage, tp, DecodeGraphMode::kOff, 12);
  const Run graphs = run_engine(stage, tp, DecodeGraphMode::kAuto, 12);
  require_same_runs(graphs.outcomes, eager.outcomes);
  REQUIRE(graphs.stats.has_value());
  CHECK(graphs.stats->captures == static_cast<int64_t>(graphs.stats->steps_by_bucket.size()));
  CHECK(graphs.stats->steps > graphs.stats->captures);  // later steps of a bucket replay
}
