// Helpers of the generation engine's tests (serve/engine.h; test_engine.cpp and
// test_decode_graphs.cpp): request outcomes, a driver that submits requests at given steps and
// steps until they finish, request sets, and comparisons of outcomes.
#pragma once
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <cmath>
#include <functional>
#include <map>

#include "generate/generate_test_util.h"
#include "serve/engine.h"

namespace loom::serve::engine_test {

using generate::test::set_truth;
using serve::FinishReason;
using serve::RequestSpec;

struct Outcome {
  std::vector<int64_t> tokens;
  std::vector<double> logprobs;
  std::vector<std::vector<std::pair<int64_t, double>>> top;
  std::vector<double> prompt_logprobs;
  FinishReason reason = FinishReason::kNone;
  std::vector<int> token_steps;  // the step each token came in (not compared across runs)
};

inline nlohmann::json outcome_json(const Outcome& o) {
  return {{"tokens", o.tokens}, {"logprobs", o.logprobs}, {"prompt", o.prompt_logprobs},
          {"top", o.top}, {"reason", static_cast<int>(o.reason)}};
}

// JSON text writes NaN (a log-probability not asked for, a prompt's first token) as null.
inline std::vector<double> doubles_from_json(const nlohmann::json& j) {
  std::vector<double> out;
  for (const auto& v : j) out.push_back(v.is_null() ? std::nan("") : v.get<double>());
  return out;
}

inline Outcome outcome_from_json(const nlohmann::json& j) {
  Outcome o;
  o.tokens = j["tokens"].get<std::vector<int64_t>>();
  o.logprobs = doubles_from_json(j["logprobs"]);
  o.prompt_logprobs = doubles_from_json(j["prompt"]);
  o.top = j["top"].get<std::vector<std::vector<std::pair<int64_t, double>>>>();
  o.reason = static_cast<FinishReason>(j["reason"].get<int>());
  return o;
}

// Serving rank: submits specs[i] once `after[i]` steps have run, steps until every request is
// done (calling after_step with each step's number), then stops every rank. Other ranks:
// steps until told to stop.
inline std::vector<Outcome> drive(serve::GenerationEngine& engine, const std::vector<RequestSpec>& specs,
                           const std::vector<int>& after, bool serving = true,
                           const std::function<void(int)>& after_step = {}) {
  std::vector<Outcome> out(specs.size());
  if (!serving) {
    while (engine.step(false)) {
    }
    return out;
  }
  std::map<uint64_t, size_t> index;
  size_t done = 0;
  int step = 0;
  auto report = [&](const serve::RequestProgress& p) {
    Outcome& o = out[index.at(p.id)];
    for (const auto& t : p.prompt) o.prompt_logprobs.push_back(std::isnan(t.logprob) ? 0.0 : t.logprob);
    for (const auto& t : p.new_tokens) {
      o.tokens.push_back(t.token);
      o.logprobs.push_back(t.logprob);
      o.top.push_back(t.top);
      o.token_steps.push_back(step);
    }
    if (p.finished != FinishReason::kNone) {
      o.reason = p.finished;
      ++done;
    }
  };
  for (; done < specs.size(); ++step) {
    for (size_t i = 0; i < specs.size(); ++i)
      if (after[i] == step) index[engine.submit(specs[i])] = i;
    engine.step(false, report);
    if (after_step) after_step(step);
    if (step > 10000) throw std::runtime_error("drive: the engine did not finish");
  }
  engine.step(true);
  return out;
}

inline serve::EngineGroups solo_groups(const runtime::CommunicatorPtr& solo) {
  static runtime::PipelineLinks single = runtime::PipelineLinks::single();
  return {solo, &single, solo.get(), 0};
}

// Prompts of different lengths, greedy, with every kind of log-probability asked for.
inline std::vector<RequestSpec> greedy_specs(const model::GptConfig& c) {
  std::vector<RequestSpec> specs;
  const std::vector<int64_t> lengths{5, 1, 9, 3, 12, 7};
  const std::vector<int64_t> news{8, 10, 6, 12, 4, 9};
  for (size_t i = 0; i < lengths.size(); ++i) {
    RequestSpec s;
    for (int64_t k = 0; k < lengths[i]; ++k) s.prompt.push_back((13 * static_cast<int64_t>(i) + 7 * k + 3) % c.vocab_size);
    s.max_new_tokens = news[i];
    s.sampling.greedy = true;
    s.stop_at_eod = false;
    s.logprobs = true;
    s.top_logprobs = 3;
    s.prompt_logprobs = i % 2 == 0;
    specs.push_back(s);
  }
  return specs;
}

// Requests that share a 10-token "system prompt", then 2 to 4 tokens of their own; greedy,
// with log-probabilities (request 3 also asks for its prompt's: it computes every position).
inline std::vector<RequestSpec> shared_prefix_specs(const model::GptConfig& c) {
  std::vector<RequestSpec> specs;
  const std::vector<int64_t> tails{2, 3, 4, 2, 3, 4};
  const std::vector<int64_t> news{8, 6, 7, 9, 5, 8};
  for (size_t i = 0; i < tails.size(); ++i) {
    RequestSpec s;
    for (int64_t k = 0; k < 10; ++k) s.prompt.push_back((5 * k + 11) % c.vocab_size);
    for (int64_t k = 0; k < tails[i]; ++k) s.prompt.push_back((17 * static_cast<int64_t>(i) + 3 * k + 1) % c.vocab_size);
    s.max_new_tokens = news[i];
    s.sampling.greedy = true;
    s.stop_at_eod = false;
    s.logprobs = true;
    s.top_logprobs = 2;
    s.prompt_logprobs = i == 3;
    specs.push_back(s);
  }
  return specs;
}

inline std::vector<RequestSpec> sampled_specs(const model::GptConfig& c) {
  std::vector<RequestSpec> specs = greedy_specs(c);
  for (size_t i = 0; i < specs.size(); ++i) {
    auto& o = specs[i].sampling;
    o.greedy = false;
    o.temperature = 0.8 + 0.1 * static_cast<double>(i);
    o.top_k = i % 2 ? 20 : 0;
    o.top_p = i % 3 ? 0.9 : 1.0;
    o.repetition_penalty = i == 2 ? 1.3 : 1.0;
    o.seed = 100 + i;
  }
  return specs;
}

// A request whose repetition penalty drives a positive logit of its prompt's tokens to inf in
// float (1e-300 is positive and finite, so the engine's own checks accept it): choosing its
// first token fails.
inline RequestSpec non_finite_spec(const model::GptConfig& c) {
  RequestSpec s = greedy_specs(c)[4];
  s.sampling.repetition_penalty = 1e-300;
  return s;
}

inline void require_same(const Outcome& a, const Outcome& b, double tol = 1e-4) {
  REQUIRE(a.tokens == b.tokens);
  REQUIRE(a.reason == b.reason);
  REQUIRE(a.logprobs.size() == b.logprobs.size());
  for (size_t i = 0; i < a.logprobs.size(); ++i) {  // NaN: not asked for (both sides alike)
    REQUIRE(std::isnan(a.logprobs[i]) == std::isnan(b.logprobs[i]));
    if (!std::isnan(a.logprobs[i])) REQUIRE(std::abs(a.logprobs[i] - b.logprobs[i]) < tol);
  }
  REQUIRE(a.prompt_logprobs.size() == b.prompt_logprobs.size());
  for (size_t i = 0; i < a.prompt_logprobs.size(); ++i)
    REQUIRE(std::abs(a.prompt_logprobs[i] - b.prompt_logprobs[i]) < tol);
  REQUIRE(a.top.size() == b.top.size());
  for (size_t i = 0; i < a.top.size(); ++i) {
    REQUIRE(a.top[i].size() == b.top[i].size());
    for (size_t k = 0; k < a.top[i].size(); ++k) {
      REQUIRE(a.top[i][k].first == b.top[i][k].first);
      REQUIRE(std::abs(a.top[i][k].second - b.top[i][k].second) < tol);
    }
  }
}

// Every request alone (a batch of one), at t = p = 1.
inline std::vector<Outcome> one_at_a_time(const model::GptStage& stage, const std::vector<RequestSpec>& specs,
                                   serve::EngineOptions options = {}) {
  std::vector<Outcome> out;
  options.max_batch = 1;
  for (const auto& s : specs) {
    serve::GenerationEngine engine(stage, solo_groups(runtime::Communicator::solo()), options);
    out.push_back(drive(engine, {s}, {0}).front());
  }
  return out;
}

inline model::GptStage truth_stage(const model::GptConfig& c) {
  model::GptStage stage(c, runtime::Communicator::solo());
  set_truth(stage, 0, 1);
  return stage;
}

}  // namespace loom::serve::engine_test
