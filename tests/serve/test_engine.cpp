// The batched generation engine (serve/engine.h): requests run together with continuous
// batching give what each gives alone (greedy: the same tokens; log-probabilities within fp32
// rounding), greedy tokens equal generate::generate_tokens, a seeded sampled request gives the
// same tokens whatever shares its batch, stop token / min tokens / stop strings / budgets, a
// request whose logits become non-finite failing alone while its batch goes on, and t = 2,
// p = 2 and t = 2 × p = 2 equal t = p = 1 (the failing request included). The paged cache:
// prefix caching on = off = one at a time with cache hits on a shared prefix, and a tiny
// block pool that preempts gives the same results, at t = p = 1 and under the layouts.
// Chunked prefill: a token budget as small as the batch (prompts split into many chunks)
// gives the results of a large budget and of one at a time, at t = 1, t = 2, p = 2 and
// t = 2 x p = 2, with and without preemption; no step's forward exceeds the budget; a long
// prompt joining beside decoding requests leaves them a token in every step. Speculation
// (ngram drafts): greedy and seeded sampled requests give the tokens of plain decoding, alone,
// batched, under a budget that cuts drafts, in a pool that preempts, at t = 2 and t = 2 x p = 2,
// with drafts accepted and rolled back. A draft model: equal to the target it accepts every
// greedy draft, any draft keeps the greedy tokens, and sampled tokens follow the target's
// exact marginals (which always accepting would not).
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <map>

#include "generate/generate_test_util.h"
#include "generate/token_generator.h"
#include "harness/multiprocess.h"
#include "harness/worker_groups.h"
#include "serve/engine.h"
#include "serve/engine_test_util.h"

using namespace loom;
using namespace loom::generate::test;
using serve::FinishReason;
using serve::RequestSpec;

using namespace loom::serve::engine_test;

TEST_CASE("Engine: batched greedy requests joining at different steps equal one at a time") {
  const auto c = tiny_config();
  const auto stage = truth_stage(c);
  const auto specs = greedy_specs(c);
  const auto alone = one_at_a_time(stage, specs);
  serve::EngineOptions options;
  options.max_batch = 4;  // six requests: two wait for rows
  serve::GenerationEngine engine(stage, solo_groups(runtime::Communicator::solo()), options);
  const auto batched = drive(engine, specs, {0, 0, 2, 3, 3, 5});
  for (size_t i = 0; i < specs.size(); ++i) {
    INFO("request " << i);
    require_same(batched[i], alone[i]);
    REQUIRE(batched[i].reason == FinishReason::kLength);
    REQUIRE(static_cast<int64_t>(batched[i].tokens.size()) == specs[i].max_new_tokens);
    REQUIRE(batched[i].prompt_logprobs.size() == (specs[i].prompt_logprobs ? specs[i].prompt.size() : 0));
  }
  // The reference: generate_tokens (one sequence, the KV cache of `loom generate`).
  auto solo = runtime::Communicator::solo();
  for (size_t i = 0; i < specs.size(); ++i) {
    generate::GenerationOptions g;
    g.max_new_tokens = specs[i].max_new_tokens;
    g.sampling.greedy = true;
    REQUIRE(generate::generate_tokens(stage, solo, specs[i].prompt, g).tokens == batched[i].tokens);
  }
  // Log-probabilities against a full forward over prompt + generated tokens.
  for (size_t i : {size_t{0}, size_t{2}}) {
    std::vector<int64_t> seq = specs[i].prompt;
    seq.insert(seq.end(), batched[i].tokens.begin(), batched[i].tokens.end());
    model::StageInputs in;
    in.tokens = at::tensor(seq, at::kLong).unsqueeze(0);  // host: test input
    in.position_ids = at::arange(static_cast<int64_t>(seq.size()), at::kLong).unsqueeze(0);  // host: test input
    model::DropoutContext off;
    off.training = false;
    at::NoGradGuard no_grad;
    const at::Tensor lp = at::log_softmax(stage.forward(in, off).select(1, 0).narrow(-1, 0, c.vocab_size).to(at::kDouble), -1);
    const int64_t n = static_cast<int64_t>(specs[i].prompt.size());
    for (int64_t k = 1; k < n; ++k)
      REQUIRE(std::abs(lp[k - 1][seq[k]].item<double>() - batched[i].prompt_logprobs[k]) < 1e-4);
    for (size_t k = 0; k < batched[i].tokens.size(); ++k) {
      REQUIRE(std::abs(lp[n - 1 + k][seq[n + k]].item<double>() - batched[i].logprobs[k]) < 1e-4);
      REQUIRE(batched[i].top[k][0].first == lp[n - 1 + k].argmax().item<int64_t>());
    }
  }
}

TEST_CASE("Engine: a seeded sampled request gives the same tokens whatever shares its batch") {
  const auto c = tiny_config();
  const auto stage = truth_stage(c);
  const auto specs = sampled_specs(c);
  const auto alone = one_at_a_time(stage, specs);
  serve::EngineOptions options;
  options.max_batch = 6;
  serve::GenerationEngine engine(stage, solo_groups(runtime::Communicator::solo()), options);
  const auto batched = drive(engine, specs, {1, 0, 0, 4, 2, 0});
  for (size_t i = 0; i < specs.size(); ++i) {
    INFO("request " << i);
    require_same(batched[i], alone[i]);
  }
  // Another seed draws other tokens (fixed seeds: this is deterministic).
  auto other = specs[0];
  other.sampling.seed = 999;
  REQUIRE(one_at_a_time(stage, {other})[0].tokens != alone[0].tokens);
  // The same seed twice in one batch: the same tokens twice.
  serve::GenerationEngine twice(stage, solo_groups(runtime::Communicator::solo()), options);
  const auto pair = drive(twice, {specs[3], specs[3]}, {0, 2});
  REQUIRE(pair[0].tokens == pair[1].tokens);
}

TEST_CASE("Engine: a request whose logits become non-finite fails alone and its batch goes on") {
  const auto c = tiny_config();
  const auto stage = truth_stage(c);
  auto specs = greedy_specs(c);
  const auto alone = one_at_a_time(stage, specs);
  specs.insert(specs.begin() + 2, non_finite_spec(c));
  serve::EngineOptions options;
  options.max_batch = 4;
  serve::GenerationEngine engine(stage, solo_groups(runtime::Communicator::solo()), options);
  const auto batched = drive(engine, specs, {0, 0, 1, 1, 2, 3, 3});
  REQUIRE(batched[2].reason == FinishReason::kError);
  REQUIRE(batched[2].tokens.empty());
  for (size_t i = 0, k = 0; i < specs.size(); ++i) {
    if (i == 2) continue;
    INFO("request " << i);
    require_same(batched[i], alone[k++]);
  }
  // The engine keeps serving: a request submitted afterwards gets its solo result.
  REQUIRE(drive(engine, {greedy_specs(c)[0]}, {0})[0].tokens == alone[0].tokens);
}

TEST_CASE("Engine: stop token, min tokens, stop strings, max_tokens 0 and the KV budget") {
  const auto c = tiny_config();
  const auto stage = truth_stage(c);
  auto spec = greedy_specs(c)[3];  // 12 greedy tokens
  const auto free_run = one_at_a_time(stage, {spec})[0];
  const int64_t eod = free_run.tokens[4];
  const size_t first = std::find(free_run.tokens.begin(), free_run.tokens.end(), eod) - free_run.tokens.begin();
  serve::EngineOptions options;
  options.eod_id = eod;
  options.decode = [](const std::vector<int64_t>& ids) {
    std::string s;
    for (int64_t id : ids) s += "<" + std::to_string(id) + ">";
    return s;
  };
  spec.stop_at_eod = true;
  auto stopped = one_at_a_time(stage, {spec}, options)[0];
  REQUIRE(stopped.reason == FinishReason::kStop);
  REQUIRE(stopped.tokens == std::vector<int64_t>(free_run.tokens.begin(), free_run.tokens.begin() + first));
  // min tokens: the stop token cannot come before 6 new tokens (its logit is -inf until then).
  auto at_least = spec;
  at_least.min_new_tokens = 6;
  const auto late = one_at_a_time(stage, {at_least}, options)[0];
  REQUIRE(late.tokens.size() >= 6);
  for (size_t k = 0; k < 6; ++k) REQUIRE(late.tokens[k] != eod);
  // A stop string: generation ends with the token that completes it.
  auto with_stop = greedy_specs(c)[3];
  with_stop.stop_strings = {"<" + std::to_string(free_run.tokens[2]) + "><" + std::to_string(free_run.tokens[3]) + ">"};
  const auto cut = one_at_a_time(stage, {with_stop}, options)[0];
  REQUIRE(cut.reason == FinishReason::kStop);
  REQUIRE(cut.tokens == std::vector<int64_t>(free_run.tokens.begin(), free_run.tokens.begin() + 4));
  // max_tokens 0 with the prompt's log-probabilities (echo): no token, the prompt scored.
  auto score_only = greedy_specs(c)[0];
  score_only.max_new_tokens = 0;
  const auto scored = one_at_a_time(stage, {score_only})[0];
  REQUIRE(scored.tokens.empty());
  REQUIRE(scored.prompt_logprobs.size() == score_only.prompt.size());
  REQUIRE(scored.reason == FinishReason::kLength);

  // Budgets: past the context or --max-kv-tokens is refused naming max_tokens; a request that
  // does not fit beside the running ones waits, and all finish with their solo results.
  options = {};
  options.max_batch = 4;
  options.max_kv_tokens = 20;
  serve::GenerationEngine engine(stage, solo_groups(runtime::Communicator::solo()), options);
  auto too_long = greedy_specs(c)[4];
  too_long.max_new_tokens = 13;  // 12 + 13 > 24
  REQUIRE_THROWS_WITH(engine.submit(too_long), Catch::Contains("max_tokens") && Catch::Contains("context"));
  too_long.max_new_tokens = 9;  // 21 > 20
  REQUIRE_THROWS_WITH(engine.submit(too_long), Catch::Contains("--max-kv-tokens"));
  RequestSpec empty;
  REQUIRE_THROWS_WITH(engine.submit(empty), Catch::Contains("prompt"));
  const auto specs = greedy_specs(c);  // kv tokens 13, 11, 15, 15, 16, 16: one at a time fits
  const auto batched = drive(engine, specs, {0, 0, 0, 0, 0, 0});
  const auto alone = one_at_a_time(stage, specs);
  for (size_t i = 0; i < specs.size(); ++i) require_same(batched[i], alone[i]);
}

namespace {

// Worker: the greedy and sampled requests under (LOOM_T, LOOM_P) with a step budget of
// LOOM_BUDGET tokens (0: the default); rank 0 writes the outcomes.
void layout_worker() {
  const int t = test::env_int("LOOM_T"), p = test::env_int("LOOM_P");
  auto groups = test::worker_groups(t, p);
  const auto c = tiny_config();
  const auto coords = groups->coords();
  const auto layout = model::pipeline_stage_layouts(c, p, 1, coords.pp).front();
  model::GptStage stage(c, groups->tensor_ptr(), layout);
  set_truth(stage, coords.tp, t);
  serve::EngineGroups eg{groups->tensor_ptr(), &groups->pipeline_links(), &groups->host_world(),
                         groups->layout().rank_of({0, 0, p - 1})};
  serve::EngineOptions options;
  options.max_batch = 4;
  options.max_num_batched_tokens = test::env_int("LOOM_BUDGET");
  serve::GenerationEngine engine(stage, eg, options);
  auto specs = greedy_specs(c);
  const auto sampled = sampled_specs(c);
  specs.insert(specs.end(), sampled.begin(), sampled.end());
  specs.push_back(non_finite_spec(c));  // its failure travels from the last stage to the others
  std::vector<int> after;
  for (size_t i = 0; i < specs.size(); ++i) after.push_back(static_cast<int>(i % 5));
  const bool serving = groups->rank() == 0;
  const auto out = drive(engine, specs, after, serving);
  if (serving) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& o : out) j.push_back(outcome_json(o));
    std::ofstream(test::env_str("LOOM_OUT")) << j.dump();
  }
  groups->shutdown();
}

}  // namespace

LOOM_WORKER("serve_engine_layout") { layout_worker(); }

TEST_CASE("Engine: t=2, p=2 and t=2 x p=2 give the t=1, p=1 results") {
  const auto c = tiny_config();
  const auto stage = truth_stage(c);
  auto specs = greedy_specs(c);
  const auto sampled = sampled_specs(c);
  specs.insert(specs.end(), sampled.begin(), sampled.end());
  specs.push_back(non_finite_spec(c));
  const auto reference = one_at_a_time(stage, specs);
  REQUIRE(reference.back().reason == FinishReason::kError);
  const std::string dir = temp_dir("serve_layouts");
  // Budget 4 = max_batch: prompts of up to 12 tokens are prefilled in chunks of 1 to 4 tokens.
  for (auto [t, p, budget] : {std::tuple{2, 1, 0}, std::tuple{1, 2, 0}, std::tuple{2, 2, 0}, std::tuple{2, 1, 4},
                              std::tuple{1, 2, 4}, std::tuple{2, 2, 4}}) {
    INFO("t = " << t << ", p = " << p << ", budget " << budget);
    const std::string out =
        dir + "/out_" + std::to_string(t) + "_" + std::to_string(p) + "_" + std::to_string(budget) + ".json";
    auto result = test::run_ranks("serve_engine_layout", t * p,
                                  {{"LOOM_T", std::to_string(t)}, {"LOOM_P", std::to_string(p)},
                                   {"LOOM_BUDGET", std::to_string(budget)}, {"LOOM_OUT", out}});
    REQUIRE(result.exit_code() == 0);
    nlohmann::json j;
    std::ifstream(out) >> j;
    REQUIRE(j.size() == specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      INFO("request " << i);
      require_same(outcome_from_json(j[i]), reference[i]);
    }
  }
  launch::remove_tree(dir);
}

TEST_CASE("Engine: prefix caching on, off and one at a time give the same outputs, with hits") {
  const auto c = tiny_config();
  const auto stage = truth_stage(c);
  const auto specs = shared_prefix_specs(c);
  const auto alone = one_at_a_time(stage, specs);
  const std::vector<int> after{0, 1, 2, 3, 3, 5};
  std::vector<std::vector<Outcome>> runs;
  for (bool caching : {true, false}) {
    serve::EngineOptions options;
    options.max_batch = 3;
    options.block_size = 4;  // the 10-token prefix spans two full blocks
    options.prefix_caching = caching;
    serve::GenerationEngine engine(stage, solo_groups(runtime::Communicator::solo()), options);
    runs.push_back(drive(engine, specs, after));
    const auto& stats = engine.prefix_cache_stats();
    INFO("caching " << caching);
    REQUIRE(stats.lookups >= static_cast<int64_t>(specs.size()));
    // Requests 1, 2, 4, 5 join after request 0 prefilled: each reuses its 8 cached positions.
    if (caching) REQUIRE(stats.hit_tokens >= 4 * 8);
    else REQUIRE(stats.hit_tokens == 0);
    REQUIRE(engine.kv_blocks_used() == 0);  // every block freed once the requests ended
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    INFO("request " << i);
    require_same(runs[0][i], runs[1][i]);
    require_same(runs[0][i], alone[i]);
    REQUIRE(static_cast<int64_t>(runs[0][i].tokens.size()) == specs[i].max_new_tokens);
  }
  REQUIRE(runs[0][3].prompt_logprobs.size() == specs[3].prompt.size());
  // A later request with the same prompt as request 0 hits every full block but the last
  // token's: the tokens are the same.
  serve::EngineOptions options;
  options.block_size = 4;
  serve::GenerationEngine engine(stage, solo_groups(runtime::Communicator::solo()), options);
  const auto twice = drive(engine, {specs[0], specs[0]}, {0, 1});
  REQUIRE(twice[1].tokens == alone[0].tokens);
  REQUIRE(engine.prefix_cache_stats().hit_tokens == 8);
}

TEST_CASE("Engine: a tiny block pool preempts the newest request and gives the same outputs") {
  const auto c = tiny_config();
  const auto stage = truth_stage(c);
  auto specs = greedy_specs(c);  // kv tokens 13, 11, 15, 15, 16, 16
  const auto alone = one_at_a_time(stage, specs);
  for (bool caching : {true, false}) {
    INFO("caching " << caching);
    serve::EngineOptions options;
    options.max_batch = 4;
    options.block_size = 4;
    options.max_kv_tokens = 24;  // 6 blocks: requests outgrow the pool together
    options.prefix_caching = caching;
    serve::GenerationEngine engine(stage, solo_groups(runtime::Communicator::solo()), options);
    REQUIRE(engine.kv_blocks() == 6);
    const auto batched = drive(engine, specs, {0, 0, 0, 0, 1, 1});
    REQUIRE(engine.preemptions() > 0);
    REQUIRE(engine.kv_blocks_used() == 0);
    for (size_t i = 0; i < specs.size(); ++i) {
      INFO("request " << i);
      require_same(batched[i], alone[i]);
    }
  }
  // Past the pool (prompt + max_tokens > --max-kv-tokens): refused at once, never queued.
  serve::EngineOptions options;
  options.block_size = 4;
  options.max_kv_tokens = 10;
  serve::GenerationEngine engine(stage, solo_groups(runtime::Communicator::solo()), options);
  REQUIRE_THROWS_WITH(engine.submit(specs[0]), Catch::Contains("--max-kv-tokens 10"));
  REQUIRE_FALSE(engine.busy());
  options.block_size = 0;
  REQUIRE_THROWS_WITH(serve::GenerationEngine(stage, solo_groups(runtime::Communicator::solo()), options),
                      Catch::Contains("block_size"));
}

namespace {

// Worker: the shared-prefix, greedy and sampled requests with a 6-block pool of 4-token blocks
// under (LOOM_T, LOOM_P), prefix caching on, a step budget of LOOM_BUDGET tokens (0: the
// default): rank 0 writes the outcomes, the cache hits and the preemptions.
void tiny_pool_worker() {
  const int t = test::env_int("LOOM_T"), p = test::env_int("LOOM_P");
  auto groups = test::worker_groups(t, p);
  const auto c = tiny_config();
  const auto coords = groups->coords();
  const auto layout = model::pipeline_stage_layouts(c, p, 1, coords.pp).front();
  model::GptStage stage(c, groups->tensor_ptr(), layout);
  set_truth(stage, coords.tp, t);
  serve::EngineGroups eg{groups->tensor_ptr(), &groups->pipeline_links(), &groups->host_world(),
                         groups->layout().rank_of({0, 0, p - 1})};
  serve::EngineOptions options;
  options.max_batch = 4;
  options.block_size = 4;
  options.max_kv_tokens = 24;
  options.max_num_batched_tokens = test::env_int("LOOM_BUDGET");
  serve::GenerationEngine engine(stage, eg, options);
  auto specs = shared_prefix_specs(c);
  for (const auto& more : {greedy_specs(c), sampled_specs(c)}) specs.insert(specs.end(), more.begin(), more.end());
  std::vector<int> after;
  for (size_t i = 0; i < specs.size(); ++i) after.push_back(static_cast<int>(i % 4));
  const bool serving = groups->rank() == 0;
  const auto out = drive(engine, specs, after, serving);
  if (serving) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& o : out) j.push_back(outcome_json(o));
    std::ofstream(test::env_str("LOOM_OUT"))
        << nlohmann::json{{"outcomes", j}, {"hits", engine.prefix_cache_stats().hit_tokens},
                          {"preemptions", engine.preemptions()}}.dump();
  }
  groups->shutdown();
}

}  // namespace

LOOM_WORKER("serve_engine_tiny_pool") { tiny_pool_worker(); }

TEST_CASE("Engine: prefix hits and preemption under t=2, p=2 and t=2 x p=2 give the t=1, p=1 results") {
  const auto c = tiny_config();
  const auto stage = truth_stage(c);
  auto specs = shared_prefix_specs(c);
  for (const auto& more : {greedy_specs(c), sampled_specs(c)}) specs.insert(specs.end(), more.begin(), more.end());
  const auto reference = one_at_a_time(stage, specs);
  const std::string dir = temp_dir("serve_tiny_pool");
  // Budget 4: prefills cut short by preemption are recomputed from the start.
  for (auto [t, p, budget] : {std::tuple{1, 1, 0}, std::tuple{2, 1, 0}, std::tuple{1, 2, 0}, std::tuple{2, 2, 0},
                              std::tuple{1, 1, 4}, std::tuple{2, 2, 4}}) {
    INFO("t = " << t << ", p = " << p << ", budget " << budget);
    const std::string out =
        dir + "/out_" + std::to_string(t) + "_" + std::to_string(p) + "_" + std::to_string(budget) + ".json";
    auto result = test::run_ranks("serve_engine_tiny_pool", t * p,
                                  {{"LOOM_T", std::to_string(t)}, {"LOOM_P", std::to_string(p)},
                                   {"LOOM_BUDGET", std::to_string(budget)}, {"LOOM_OUT", out}});
    REQUIRE(result.exit_code() == 0);
    nlohmann::json j;
    std::ifstream(out) >> j;
    REQUIRE(j["outcomes"].size() == specs.size());
    REQUIRE(j["hits"].get<int64_t>() > 0);
    REQUIRE(j["preemptions"].get<int64_t>() > 0);
    for (size_t i = 0; i < specs.size(); ++i) {
      INFO("request " << i);
      require_same(outcome_from_json(j["outcomes"][i]), reference[i]);
    }
  }
  launch::remove_tree(dir);
}

TEST_CASE("Engine: chunked prefill under a tiny budget equals a large budget and one at a time") {
  const auto c = tiny_config();
  const auto stage = truth_stage(c);
  auto specs = greedy_specs(c);  // prompts of 1 to 12 tokens, some asking for their log-probabilities
  for (const auto& more : {shared_prefix_specs(c), sampled_specs(c)}) specs.insert(specs.end(), more.begin(), more.end());
  const auto alone = one_at_a_time(stage, specs);
  std::vector<int> after;
  for (size_t i = 0; i < specs.size(); ++i) after.push_back(static_cast<int>(i % 7));
  std::map<int64_t, std::vector<Outcome>> runs;
  for (int64_t budget : {3, 5, 512}) {
    INFO("budget " << budget);
    serve::EngineOptions options;
    options.max_batch = 3;
    options.block_size = 4;
    options.max_num_batched_tokens = budget;
    serve::GenerationEngine engine(stage, solo_groups(runtime::Communicator::solo()), options);
    int64_t largest = 0;
    runs[budget] = drive(engine, specs, after, true, [&](int) {
      REQUIRE(engine.last_step_tokens() <= budget);
      largest = std::max(largest, engine.last_step_tokens());
    });
    if (budget < 512) REQUIRE(largest == budget);  // the 5-token prompt joining first fills it
    REQUIRE(engine.prefix_cache_stats().hit_tokens > 0);
    REQUIRE(engine.kv_blocks_used() == 0);
    for (size_t i = 0; i < specs.size(); ++i) {
      INFO("request " << i);
      require_same(runs[budget][i], alone[i]);
      REQUIRE(runs[budget][i].prompt_logprobs.size() == (specs[i].prompt_logprobs ? specs[i].prompt.size() : 0));
    }
  }
  for (size_t i = 0; i < specs.size(); ++i) require_same(runs[3][i], runs[512][i]);
  // The budget must leave a token for every running request.
  serve::EngineOptions options;
  options.max_batch = 4;
  options.max_num_batched_tokens = 3;
  REQUIRE_THROWS_WITH(serve::GenerationEngine(stage, solo_groups(runtime::Communicator::solo()), options),
                      Catch::Contains("--max-num-batched-tokens") && Catch::Contains(">= --max-batch (4)") &&
                          Catch::Contains("found 3"));
  options.max_num_batched_tokens = -1;
  REQUIRE_THROWS_WITH(serve::GenerationEngine(stage, solo_groups(runtime::Communicator::solo()), options),
                      Catch::Contains("--max-num-batched-tokens"));
  options.max_num_batched_tokens = 0;  // the default, raised to max_batch
  options.max_batch = 600;
  REQUIRE(serve::resolve_engine_options(options, 24).max_num_batched_tokens == 600);
  options.max_batch = 4;
  REQUIRE(serve::resolve_engine_options(options, 24).max_num_batched_tokens == serve::kDefaultMaxNumBatchedTokens);
}

TEST_CASE("Engine: a long prompt joining beside decoding requests leaves them a token in every step") {
  const auto c = tiny_config();
  const auto stage = truth_stage(c);
  std::vector<RequestSpec> specs;
  for (int64_t i = 0; i < 2; ++i) {  // two one-token prompts that decode 16 tokens each
    RequestSpec s;
    s.prompt = {3 + i};
    s.max_new_tokens = 16;
    s.sampling.greedy = true;
    s.stop_at_eod = false;
    specs.push_back(s);
  }
  RequestSpec long_prompt;  // 20 tokens: with two decodes in a 4-token budget, 10 chunks of 2
  for (int64_t k = 0; k < 20; ++k) long_prompt.prompt.push_back((11 * k + 2) % c.vocab_size);
  long_prompt.max_new_tokens = 3;
  long_prompt.sampling.greedy = true;
  long_prompt.stop_at_eod = false;
  long_prompt.prompt_logprobs = true;  // scored chunk by chunk
  specs.push_back(long_prompt);
  const auto alone = one_at_a_time(stage, specs);
  serve::EngineOptions options;
  options.max_batch = 3;
  options.max_num_batched_tokens = 4;
  options.max_kv_tokens = 96;  // room for all three: no preemption
  serve::GenerationEngine engine(stage, solo_groups(runtime::Communicator::solo()), options);
  std::vector<int64_t> step_tokens;
  const auto out = drive(engine, specs, {0, 0, 2}, true, [&](int) { step_tokens.push_back(engine.last_step_tokens()); });
  for (size_t i = 0; i < specs.size(); ++i) {
    INFO("request " << i);
    require_same(out[i], alone[i]);
  }
  // The short ones: a token in each of 16 consecutive steps (the first from their own prefill
  // in step 0), the long prompt's ten chunks included.
  for (size_t i = 0; i < 2; ++i) {
    REQUIRE(out[i].token_steps.size() == 16);
    for (size_t k = 0; k < 16; ++k) REQUIRE(out[i].token_steps[k] == static_cast<int>(k));
  }
  // The long one joined in step 2 and its first token came with its tenth chunk, in step 11.
  REQUIRE(out[2].token_steps.front() == 11);
  for (int s = 2; s <= 11; ++s) REQUIRE(step_tokens[static_cast<size_t>(s)] == 4);
  for (int64_t t : step_tokens) REQUIRE(t <= 4);
  REQUIRE(out[2].prompt_logprobs.size() == 20);
}

namespace {

// Prompts that repeat (prompt lookup finds drafts at once) and plain ones; greedy and seeded
// sampled (penalties, top-k, top-p, min tokens), with log-probabilities.
std::vector<RequestSpec> speculative_specs(const model::GptConfig& c) {
  std::vector<RequestSpec> specs;
  for (size_t i = 0; i < 4; ++i) {
    RequestSpec s;
    const int64_t period = 2 + static_cast<int64_t>(i % 3);
    for (int64_t k = 0; k < 9; ++k) s.prompt.push_back((11 * static_cast<int64_t>(i) + 5 * (k % period) + 2) % c.vocab_size);
    s.max_new_tokens = 12;
    s.sampling.greedy = true;
    s.stop_at_eod = false;
    s.logprobs = true;
    s.top_logprobs = 2;
    specs.push_back(s);
  }
  for (size_t i = 0; i < 4; ++i) {
    RequestSpec s = specs[i];
    auto& o = s.sampling;
    o.greedy = false;
    o.temperature = 0.6 + 0.3 * static_cast<double>(i);
    o.top_k = i % 2 ? 10 : 0;
    o.top_p = i == 2 ? 0.8 : 1.0;
    o.repetition_penalty = i == 3 ? 1.2 : 1.0;
    o.seed = 500 + i;
    s.min_new_tokens = i == 1 ? 6 : 0;
    s.stop_at_eod = i == 1;
    specs.push_back(s);
  }
  for (const auto& more : {greedy_specs(c), sampled_specs(c)}) specs.insert(specs.end(), more.begin(), more.end());
  return specs;
}

serve::EngineOptions speculating(serve::EngineOptions o, int64_t k) {
  o.speculative.method = serve::SpeculativeMethod::kNgram;
  o.speculative.num_tokens = k;
  o.speculative.prompt_lookup_min = 1;
  o.speculative.prompt_lookup_max = 3;
  return o;
}

}  // namespace

TEST_CASE("Engine: ngram speculation gives the tokens of plain decoding, greedy and seeded sampled") {
  const auto c = tiny_config();
  const auto stage = truth_stage(c);
  const auto specs = speculative_specs(c);
  const auto plain = one_at_a_time(stage, specs);
  // One at a time, batched, under a budget that cuts drafts, and in a tiny pool that preempts.
  for (auto [k, batch, budget, pool] : {std::tuple{3, 1, 0, 0}, std::tuple{1, 4, 0, 0}, std::tuple{4, 4, 0, 0},
                                        std::tuple{4, 4, 6, 0}, std::tuple{3, 4, 0, 24}}) {
    INFO("k " << k << ", max_batch " << batch << ", budget " << budget << ", pool " << pool);
    serve::EngineOptions options;
    options.max_batch = batch;
    options.max_num_batched_tokens = budget;
    if (pool > 0) {
      options.block_size = 4;
      options.max_kv_tokens = pool;
    }
    options = speculating(options, k);
    std::vector<Outcome> out;
    int64_t drafted = 0, accepted = 0, preemptions = 0;
    auto run = [&](const std::vector<RequestSpec>& s, const std::vector<int>& after) {
      serve::GenerationEngine engine(stage, solo_groups(runtime::Communicator::solo()), options);
      auto o = drive(engine, s, after, true, [&](int) {
        REQUIRE(engine.last_step_tokens() <= engine.options().max_num_batched_tokens);
      });
      drafted += engine.drafted_tokens();
      accepted += engine.accepted_tokens();
      preemptions += engine.preemptions();
      REQUIRE(engine.kv_blocks_used() == 0);
      return o;
    };
    if (batch == 1) {
      for (const auto& s : specs) out.push_back(run({s}, {0}).front());
    } else {
      std::vector<int> after;
      for (size_t i = 0; i < specs.size(); ++i) after.push_back(static_cast<int>(i % 3));
      out = run(specs, after);
    }
    for (size_t i = 0; i < specs.size(); ++i) {
      INFO("request " << i);
      require_same(out[i], plain[i]);
    }
    // Drafts were made, some accepted (several tokens in one step) and some rolled back.
    REQUIRE(drafted > 0);
    REQUIRE(accepted > 0);
    REQUIRE(accepted < drafted);
    if (pool > 0) REQUIRE(preemptions > 0);
  }
}

namespace {

// Worker body of the speculation cases: the speculative specs under (LOOM_T, LOOM_P) with the
// engine options `speculate(options)` gives; rank 0 writes the outcomes and the acceptance
// counters.
template <class Speculate>
void run_speculative_worker(Speculate speculate) {
  const int t = test::env_int("LOOM_T"), p = test::env_int("LOOM_P");
  auto groups = test::worker_groups(t, p);
  const auto c = tiny_config();
  const auto coords = groups->coords();
  const auto layout = model::pipeline_stage_layouts(c, p, 1, coords.pp).front();
  model::GptStage stage(c, groups->tensor_ptr(), layout);
  set_truth(stage, coords.tp, t);
  serve::EngineGroups eg{groups->tensor_ptr(), &groups->pipeline_links(), &groups->host_world(),
                         groups->layout().rank_of({0, 0, p - 1})};
  serve::EngineOptions options;
  options.max_batch = 4;
  serve::GenerationEngine engine(stage, eg, speculate(options));
  const auto specs = speculative_specs(c);
  std::vector<int> after;
  for (size_t i = 0; i < specs.size(); ++i) after.push_back(static_cast<int>(i % 3));
  const bool serving = groups->rank() == 0;
  const auto out = drive(engine, specs, after, serving);
  if (serving) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& o : out) j.push_back(outcome_json(o));
    std::ofstream(test::env_str("LOOM_OUT"))
        << nlohmann::json{{"outcomes", j}, {"drafted", engine.drafted_tokens()}, {"accepted", engine.accepted_tokens()}}
               .dump();
  }
  groups->shutdown();
}

// Ngram speculation with k = 3.
void speculative_worker() {
  run_speculative_worker([](const serve::EngineOptions& options) { return speculating(options, 3); });
}

}  // namespace

LOOM_WORKER("serve_engine_speculative") { speculative_worker(); }

TEST_CASE("Engine: ngram speculation under t=2 and t=2 x p=2 gives the t=1, p=1 plain tokens") {
  const auto c = tiny_config();
  const auto stage = truth_stage(c);
  const auto specs = speculative_specs(c);
  const auto plain = one_at_a_time(stage, specs);
  const std::string dir = temp_dir("serve_speculative");
  for (auto [t, p] : {std::tuple{2, 1}, std::tuple{2, 2}}) {
    INFO("t = " << t << ", p = " << p);
    const std::string out = dir + "/out_" + std::to_string(t) + "_" + std::to_string(p) + ".json";
    auto result = test::run_ranks("serve_engine_speculative", t * p,
                                  {{"LOOM_T", std::to_string(t)}, {"LOOM_P", std::to_string(p)}, {"LOOM_OUT", out}});
    REQUIRE(result.exit_code() == 0);
    nlohmann::json j;
    std::ifstream(out) >> j;
    REQUIRE(j["drafted"].get<int64_t>() > 0);
    REQUIRE(j["accepted"].get<int64_t>() > 0);
    for (size_t i = 0; i < specs.size(); ++i) {
      INFO("request " << i);
      require_same(outcome_from_json(j["outcomes"][i]), plain[i]);
    }
  }
  launch::remove_tree(dir);
}

namespace {

// A smaller draft model: the truth model's first two layers (its vocabulary), perturbed by
// `sharpen` (its embeddings scaled) so that its distribution differs from the target's.
model::GptStage small_draft(const model::GptConfig& target, double sharpen = 1.0) {
  model::GptConfig c = target;
  c.num_layers = 2;
  model::GptStage s(c, runtime::Communicator::solo());
  set_truth(s, 0, 1);
  at::NoGradGuard no_grad;
  if (sharpen != 1.0)
    for (const auto& p : s.parameters())
      if (p.word_embedding) p.tensor.mul_(sharpen);
  return s;
}

serve::EngineOptions drafting(serve::EngineOptions o, const model::GptStage& draft, int64_t k) {
  o.speculative.method = serve::SpeculativeMethod::kDraft;
  o.speculative.num_tokens = k;
  o.draft_model = &draft;
  return o;
}

// softmax of the last position's logits of each sequence (all of one length), [B, V] float64.
at::Tensor last_probs(const model::GptStage& stage, const std::vector<std::vector<int64_t>>& seqs) {
  std::vector<int64_t> flat;
  for (const auto& s : seqs) flat.insert(flat.end(), s.begin(), s.end());
  const int64_t b = static_cast<int64_t>(seqs.size()), n = static_cast<int64_t>(seqs.front().size());
  model::StageInputs in;
  in.tokens = at::tensor(flat, at::kLong).view({b, n});  // host: test input
  in.position_ids = at::arange(n, at::kLong).unsqueeze(0).expand({b, n}).contiguous();  // host: test input
  model::DropoutContext off;
  off.training = false;
  at::NoGradGuard no_grad;
  const int64_t vocab = stage.config().vocab_size;
  return at::softmax(stage.forward(in, off).select(0, n - 1).narrow(-1, 0, vocab).to(at::kDouble), -1);
}

double total_variation(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().sum().item<double>() / 2; }

}  // namespace

TEST_CASE("Engine: a draft model equal to the target accepts every draft, and any draft keeps greedy outputs") {
  const auto c = tiny_config();
  const auto stage = truth_stage(c);
  const auto small = small_draft(c);
  auto specs = speculative_specs(c);
  specs.resize(4);  // the greedy repetitive ones
  for (const auto& more : greedy_specs(c)) specs.push_back(more);
  const auto plain = one_at_a_time(stage, specs);
  for (const model::GptStage* draft : {&stage, &small}) {
    INFO((draft == &stage ? "draft = target" : "a smaller draft"));
    serve::EngineOptions options;
    options.max_batch = 4;
    serve::GenerationEngine engine(stage, solo_groups(runtime::Communicator::solo()), drafting(options, *draft, 3));
    std::vector<int> after;
    for (size_t i = 0; i < specs.size(); ++i) after.push_back(static_cast<int>(i % 3));
    const auto out = drive(engine, specs, after);
    for (size_t i = 0; i < specs.size(); ++i) {
      INFO("request " << i);
      require_same(out[i], plain[i]);
    }
    REQUIRE(engine.drafted_tokens() > 0);
    REQUIRE(engine.kv_blocks_used() == 0);
    if (draft == &stage) {
      REQUIRE(engine.accepted_tokens() == engine.drafted_tokens());  // acceptance rate 1
    } else {
      REQUIRE(engine.accepted_tokens() < engine.drafted_tokens());
    }
  }
  // Sampled requests with the target as its own draft: p = q up to the rounding of two
  // forwards, so (almost) every draft is accepted.
  serve::EngineOptions options;
  options.max_batch = 6;
  serve::GenerationEngine engine(stage, solo_groups(runtime::Communicator::solo()), drafting(options, stage, 3));
  const auto sampled = sampled_specs(c);
  drive(engine, sampled, std::vector<int>(sampled.size(), 0));
  REQUIRE(engine.drafted_tokens() > 20);
  REQUIRE(engine.accepted_tokens() >= engine.drafted_tokens() * 99 / 100);
  // A draft without the method, or the method without a draft, is refused.
  options.speculative.method = serve::SpeculativeMethod::kDraft;
  REQUIRE_THROWS_WITH(serve::GenerationEngine(stage, solo_groups(runtime::Communicator::solo()), options),
                      Catch::Contains("--draft-checkpoint"));
}

TEST_CASE("Engine: with a draft model, sampled tokens follow the target's distribution") {
  // Vocabulary 16; a fixed prompt; N seeded requests of 4 tokens at temperature 1 whose 2nd
  // and 3rd tokens are verified drafts (k = 2 at the first decode step). Their marginals
  // against the target's exact ones, sum over t1 (and t2) of p(t1) p(t2 | t1) (p(t3 | t1, t2)),
  // from full forwards; always accepting would give the draft's marginals, far beyond the bound.
  const auto c = tiny_config(16);
  const auto stage = truth_stage(c);
  const auto draft = small_draft(c, 3.0);
  const std::vector<int64_t> prompt = {3, 1, 4, 1, 5};
  const int64_t vocab = 16, n = 800;
  auto exact = [&](const model::GptStage& m, const model::GptStage& next) {
    // t1 from the target (the prefill's token is never drafted), t2 and t3 from `next`.
    const at::Tensor p1 = last_probs(stage, {prompt})[0];
    std::vector<std::vector<int64_t>> one, two;
    for (int64_t a = 0; a < vocab; ++a) {
      auto s = prompt;
      s.push_back(a);
      one.push_back(s);
      for (int64_t b = 0; b < vocab; ++b) {
        auto t = s;
        t.push_back(b);
        two.push_back(t);
      }
    }
    const at::Tensor p2 = last_probs(next, one);                      // [a, b]
    const at::Tensor p3 = last_probs(next, two).view({vocab, vocab, vocab});  // [a, b, c]
    const at::Tensor joint12 = p1.view({vocab, 1}) * p2;
    (void)m;
    return std::pair{joint12.sum(0), (joint12.unsqueeze(2) * p3).sum(at::IntArrayRef{0, 1})};
  };
  const auto [want2, want3] = exact(stage, stage);
  const auto [always2, always3] = exact(stage, draft);  // what always accepting the draft gives
  std::vector<RequestSpec> specs;
  for (int64_t i = 0; i < n; ++i) {
    RequestSpec s;
    s.prompt = prompt;
    s.max_new_tokens = 4;
    s.stop_at_eod = false;
    s.sampling.seed = 1000 + static_cast<uint64_t>(i);
    specs.push_back(s);
  }
  serve::EngineOptions options;
  options.max_batch = 128;
  serve::GenerationEngine engine(stage, solo_groups(runtime::Communicator::solo()), drafting(options, draft, 2));
  const auto out = drive(engine, specs, std::vector<int>(specs.size(), 0));
  at::Tensor got2 = at::zeros({vocab}, at::kDouble), got3 = at::zeros({vocab}, at::kDouble);  // host: test counts
  for (const auto& o : out) {
    REQUIRE(o.tokens.size() == 4);
    got2[o.tokens[1]] += 1.0 / n;
    got3[o.tokens[2]] += 1.0 / n;
  }
  INFO("drafted " << engine.drafted_tokens() << ", accepted " << engine.accepted_tokens());
  REQUIRE(engine.drafted_tokens() >= 2 * n);
  REQUIRE(engine.accepted_tokens() < engine.drafted_tokens());
  const double bound = 0.08;  // sampling noise of n = 800 draws over 16 tokens: TV about 0.035
  INFO("TV(t2) " << total_variation(got2, want2) << ", TV(t3) " << total_variation(got3, want3)
                 << ", always accepting: " << total_variation(always2, want2) << ", "
                 << total_variation(always3, want3));
  CHECK(total_variation(got2, want2) <= bound);
  CHECK(total_variation(got3, want3) <= bound);
  REQUIRE(total_variation(always2, want2) > 2 * bound);
  REQUIRE(total_variation(always3, want3) > 2 * bound);
}

namespace {

// Greedy and sampled speculative specs with a smaller draft model (whole on every rank), k = 3.
void draft_worker() {
  const auto draft = small_draft(tiny_config());
  run_speculative_worker([&draft](const serve::EngineOptions& options) { return drafting(options, draft, 3); });
}

}  // namespace

LOOM_WORKER("serve_engine_draft") { draft_worker(); }

TEST_CASE("Engine: a draft model under t=2 and t=2 x p=2 gives the t=1 tokens, greedy and sampled") {
  const auto c = tiny_config();
  const auto stage = truth_stage(c);
  const auto draft = small_draft(c);
  const auto specs = speculative_specs(c);
  const auto plain = one_at_a_time(stage, specs);
  // The t = 1 reference with the same draft: every rank drafts the same tokens, so the seeded
  // sampled requests draw the same numbers too.
  serve::EngineOptions options;
  options.max_batch = 4;
  serve::GenerationEngine engine(stage, solo_groups(runtime::Communicator::solo()), drafting(options, draft, 3));
  std::vector<int> after;
  for (size_t i = 0; i < specs.size(); ++i) after.push_back(static_cast<int>(i % 3));
  const auto reference = drive(engine, specs, after);
  for (size_t i = 0; i < specs.size(); ++i)
    if (specs[i].sampling.greedy) require_same(reference[i], plain[i]);
  const std::string dir = temp_dir("serve_draft");
  for (auto [t, p] : {std::tuple{2, 1}, std::tuple{2, 2}}) {
    INFO("t = " << t << ", p = " << p);
    const std::string out = dir + "/out_" + std::to_string(t) + "_" + std::to_string(p) + ".json";
    auto result = test::run_ranks("serve_engine_draft", t * p,
                                  {{"LOOM_T", std::to_string(t)}, {"LOOM_P", std::to_string(p)}, {"LOOM_OUT", out}});
    REQUIRE(result.exit_code() == 0);
    nlohmann::json j;
    std::ifstream(out) >> j;
    REQUIRE(j["drafted"].get<int64_t>() > 0);
    REQUIRE(j["accepted"].get<int64_t>() > 0);
    for (size_t i = 0; i < specs.size(); ++i) {
      INFO("request " << i);
      require_same(outcome_from_json(j["outcomes"][i]), reference[i]);
    }
  }
  launch::remove_tree(dir);
}
