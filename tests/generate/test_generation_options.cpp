// Generation options beyond sampling (generate/token_generator.h, generate/sampling.h): the
// repetition penalty (Hugging Face's rule), a minimum number of new tokens before
// <|endoftext|>, stop strings checked on the decoded text and cut from it, and virtual tokens
// spliced in the prefill (prompt learning).
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include "data/gpt2_tokenizer.h"
#include "generate/generate_run.h"
#include "generate/sampling.h"
#include "generate/sampling_batch.h"
#include "generate/token_generator.h"
#include "generate_test_util.h"

using namespace loom;
using namespace loom::generate;
using namespace loom::generate::test;

namespace {

const std::vector<int64_t> kPrompt = {5, 17, 3, 99, 42};
runtime::CommunicatorPtr solo() { return runtime::Communicator::solo(); }

}  // namespace

TEST_CASE("repetition penalty divides positive and multiplies negative logits of seen tokens, once each") {
  auto penalized = [](std::vector<float> z, std::vector<int64_t> seen, double penalty) {
    SampleRow r;
    r.options.greedy = true;
    r.options.repetition_penalty = penalty;
    r.penalized = &seen;
    const at::Tensor out =
        processed_logits(at::tensor(z).view({1, static_cast<int64_t>(z.size())}), {r}).contiguous();  // host: test input
    return std::vector<float>(out.data_ptr<float>(), out.data_ptr<float>() + out.numel());
  };
  // 7 and -2 are outside: ignored.
  CHECK(penalized({2.0f, -1.0f, 0.5f, 3.0f}, {0, 1, 1, 7, -2}, 2.0) == std::vector<float>{1.0f, -2.0f, 0.5f, 3.0f});
  CHECK(penalized({2.0f, -1.0f}, {0, 1}, 1.0) == std::vector<float>{2.0f, -1.0f});
  SamplingOptions o;
  o.repetition_penalty = 0.0;
  CHECK_THROWS_WITH(validate(o), Catch::Contains("--repetition-penalty"));
  o.greedy = true;  // checked for greedy decoding too
  CHECK_THROWS_WITH(validate(o), Catch::Contains("--repetition-penalty"));
}

TEST_CASE("a strong repetition penalty keeps greedy decoding off the context's tokens") {
  model::GptStage model(tiny_config(), solo());
  set_truth(model, 0, 1);
  GenerationOptions o;
  o.max_new_tokens = 12;
  o.sampling.greedy = true;
  const auto plain = generate_tokens(model, solo(), kPrompt, o).tokens;
  o.sampling.repetition_penalty = 1e6;
  const auto penalised = generate_tokens(model, solo(), kPrompt, o).tokens;
  CHECK(penalised != plain);
  std::vector<int64_t> seen = kPrompt;
  for (int64_t t : penalised) {
    // Each new token is one not seen before (the model has 100 tokens, 17 are used).
    CHECK(std::find(seen.begin(), seen.end(), t) == seen.end());
    seen.push_back(t);
  }
}

TEST_CASE("min_new_tokens forbids the stop token until then, stop_when ends generation") {
  model::GptStage model(tiny_config(), solo());
  set_truth(model, 0, 1);
  GenerationOptions o;
  o.max_new_tokens = 10;
  o.sampling.greedy = true;
  const auto free_run = generate_tokens(model, solo(), kPrompt, o).tokens;
  o.stop_token = free_run[0];  // greedy would stop at once
  CHECK(generate_tokens(model, solo(), kPrompt, o).tokens.empty());
  o.min_new_tokens = 3;
  const auto held = generate_tokens(model, solo(), kPrompt, o);
  REQUIRE(held.tokens.size() >= 3);
  for (size_t i = 0; i < 3; ++i) CHECK(held.tokens[i] != o.stop_token);

  GenerationOptions s;
  s.max_new_tokens = 10;
  s.sampling.greedy = true;
  s.stop_when = [](const std::vector<int64_t>& tokens) { return tokens.size() == 4; };
  const auto cut = generate_tokens(model, solo(), kPrompt, s);
  CHECK(cut.reason == StopReason::kStopString);
  CHECK(cut.tokens == std::vector<int64_t>(free_run.begin(), free_run.begin() + 4));
}

TEST_CASE("stop strings end generation and are cut from the text") {
  data::Gpt2Tokenizer tok(std::string(LOOM_SOURCE_DIR) + "/data/gpt2-vocab.json",
                          std::string(LOOM_SOURCE_DIR) + "/data/gpt2-merges.txt");
  const auto ids32 = tok.encode(" to be, or not to be");
  const std::vector<int64_t> ids(ids32.begin(), ids32.end());
  CHECK(continuation_text(ids, {", or"}, tok) == " to be");
  CHECK(continuation_text(ids, {"not", " to"}, tok).empty());
  CHECK(continuation_text(ids, {"xyz"}, tok) == " to be, or not to be");
  GenerateRequest r;
  r.stop_strings = {"be,"};
  const auto o = generation_options(r, tok);
  REQUIRE(o.stop_when);
  CHECK_FALSE(o.stop_when(std::vector<int64_t>(ids.begin(), ids.begin() + 2)));  // " to be"
  CHECK(o.stop_when(std::vector<int64_t>(ids.begin(), ids.begin() + 3)));         // " to be,"
  CHECK(o.stop_token == tok.eod_id());
}

TEST_CASE("virtual tokens spliced in the prefill change what follows, and equal the full forward's splice") {
  model::GptStage model(tiny_config(), solo());
  set_truth(model, 0, 1);
  GenerationOptions o;
  o.max_new_tokens = 6;
  o.sampling.greedy = true;
  model::PromptSplice splice;
  splice.seq_index = at::tensor(std::vector<int64_t>{0, 1});
  splice.batch_index = at::zeros({2}, at::kLong);
  splice.vectors = at::randn({2, 32}, at::make_generator<at::CPUGeneratorImpl>(3)) * 3.0;
  const auto plain = generate_tokens(model, solo(), kPrompt, o).tokens;
  const auto spliced = generate_tokens(model, solo(), kPrompt, o, splice).tokens;
  CHECK(spliced != plain);
  // The first new token is the argmax of the full forward's last position with the same splice.
  at::NoGradGuard g;
  model::StageInputs in;
  in.tokens = at::tensor(kPrompt).unsqueeze(0);
  in.position_ids = at::arange(5, at::kLong).unsqueeze(0);
  in.prompt = splice;
  model::DropoutContext off;
  off.training = false;
  const at::Tensor logits = model.forward(in, off);  // [s, 1, V_padded]
  CHECK(logits[4][0].narrow(0, 0, 100).argmax().item<int64_t>() == spliced[0]);
}
