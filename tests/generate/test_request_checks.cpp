// The inference vocabulary `loom generate` and `loom serve` share: the one request check
// (generate/request_checks.h) names each field as the caller's interface does and enforces
// the context budget only where the model reserves it; sample_rows (one step's choice) applies the
// repetition penalty and holds the stop token back before min_new_tokens; every StopReason
// has its own words.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <limits>
#include <set>
#include <string>

#include "generate/request_checks.h"
#include "generate/sampling.h"
#include "generate/sampling_batch.h"
#include "generate/stop_reason.h"

using namespace loom::generate;

namespace {

// A model of 10 tokens of context and a vocabulary of 50.
constexpr ModelBounds kModel{50, 10};

SamplingOptions greedy() {
  SamplingOptions o;
  o.greedy = true;
  return o;
}

// The message check_request throws for these fields (the APIs' names), or "" when it accepts.
std::string refusal(const std::vector<int64_t>& prompt, int64_t max_new, int64_t min_new = 0,
                    const std::vector<std::string>& stops = {}, int64_t top_logprobs = 0,
                    const ModelBounds& model = kModel) {
  try {
    check_request(prompt, max_new, min_new, stops, top_logprobs, greedy(), model, RequestFieldNames{});
  } catch (const RequestError& e) {
    CHECK(std::string(e.what()) == e.field() + ": " + e.message());
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("check_request refuses each bad field, naming it") {
  CHECK(refusal({1, 2, 3}, 7).empty());  // 3 + 7 = the context exactly
  CHECK(refusal({}, 1) == "prompt: expected at least one token");
  CHECK(refusal({1, 50}, 1) == "prompt: token id 50 is outside the vocabulary [0, 50)");
  CHECK(refusal({1, -1}, 1) == "prompt: token id -1 is outside the vocabulary [0, 50)");
  CHECK(refusal(std::vector<int64_t>(11, 1), 0) == "prompt: 11 tokens, more than the model's context of 10 tokens");
  CHECK(refusal({1}, -1) == "max_tokens: expected an integer >= 0, found -1");
  CHECK(refusal({1, 2, 3}, 8) == "max_tokens: 3 prompt tokens + 8 new tokens exceed the model's context of 10 tokens");
  CHECK(refusal({1}, 1, -2) == "min_tokens: expected an integer >= 0, found -2");
  CHECK(refusal({1}, 1, 0, {"a", ""}) == "stop: expected non-empty strings");
  CHECK(refusal({1}, 1, 0, {}, kMaxTopLogprobs).empty());
  CHECK(refusal({1}, 1, 0, {}, kMaxTopLogprobs + 1) == "logprobs: expected an integer in [0, 20], found 21");
  CHECK(refusal({1}, 1, 0, {}, -1) == "logprobs: expected an integer in [0, 20], found -1");
  // generate_tokens does not reserve the new tokens: generation stops when the context is full.
  ModelBounds open = kModel;
  open.reserve_max_new_tokens = false;
  CHECK(refusal({1, 2, 3}, 100, 0, {}, 0, open).empty());
  CHECK(!refusal(std::vector<int64_t>(11, 1), 0, 0, {}, 0, open).empty());
}

TEST_CASE("check_request names the fields as the caller's interface does") {
  const RequestFieldNames flags = generate_flag_names();
  CHECK_THROWS_WITH(check_request({1}, -1, 0, {}, 0, greedy(), kModel, flags),
                    "--max-new-tokens: expected an integer >= 0, found -1");
  CHECK_THROWS_WITH(check_request({1}, 1, -1, {}, 0, greedy(), kModel, flags), Catch::StartsWith("--min-new-tokens: "));
  CHECK_THROWS_WITH(check_request({1}, 1, 0, {""}, 0, greedy(), kModel, flags), Catch::StartsWith("--stop: "));
  CHECK_THROWS_WITH(check_prompt_length(12, kModel, "--prompt"), Catch::StartsWith("--prompt: 12 tokens"));
  RequestFieldNames nemo;
  nemo.prompt = "sentences";
  nemo.max_new_tokens = "tokens_to_generate";
  CHECK_THROWS_WITH(check_token_budget(6, 5, kModel, nemo), Catch::StartsWith("tokens_to_generate: 6 prompt tokens"));
  CHECK_NOTHROW(check_token_budget(6, 4, kModel, nemo));
  // The sampling options keep validate()'s own flag names.
  SamplingOptions hot;
  hot.temperature = 0;
  CHECK_THROWS_WITH(check_request_fields(1, 0, {}, 0, hot, flags), Catch::Contains("--temperature"));
}

TEST_CASE("one step's choice: the repetition penalty, then the stop token held back before min_new_tokens") {
  const at::Tensor logits = at::tensor(std::vector<float>{1.0f, 4.0f, 3.0f, 2.0f}).view({1, 4});  // host: test input
  const std::vector<int64_t> context = {1};
  auto row = [&](const SamplingOptions& o, int64_t banned) {
    SampleRow r;
    r.options = o;
    r.penalized = &context;
    r.banned_token = banned;
    return r;
  };
  // Token 1 is the argmax; with a penalty of 2 on the context {1}, its logit falls to 2 and
  // token 2 wins; the raw logits are what a caller keeps (the engine's log-probabilities).
  SamplingOptions penalised = greedy();
  penalised.repetition_penalty = 2.0;
  CHECK(sample_rows(logits, {row(penalised, -1)}).tokens[0] == 2);
  CHECK(processed_logits(logits, {row(penalised, -1)})[0][1].item<float>() == 2.0f);
  CHECK(logits[0][1].item<float>() == 4.0f);
  // Stop token 1 held back (the caller bans it while fewer than min_new_tokens exist).
  CHECK(sample_rows(logits, {row(greedy(), 1)}).tokens[0] == 2);
  CHECK(processed_logits(logits, {row(greedy(), 1)})[0][1].item<float>() == -std::numeric_limits<float>::infinity());
  CHECK(sample_rows(logits, {row(greedy(), -1)}).tokens[0] == 1);
  // A banned token outside the vocabulary (none) changes nothing.
  CHECK(sample_rows(logits, {row(greedy(), 7)}).tokens[0] == 1);
}

TEST_CASE("every StopReason has its own words") {
  std::set<std::string> words;
  for (StopReason r : {StopReason::kNone, StopReason::kMaxNewTokens, StopReason::kStopToken, StopReason::kStopString,
                       StopReason::kContextFull, StopReason::kStop, StopReason::kCancelled, StopReason::kError})
    words.insert(describe(r));
  CHECK(words.size() == 8);
  CHECK(words.count("") == 0);
  CHECK(StopReason::kLength == StopReason::kMaxNewTokens);
}
