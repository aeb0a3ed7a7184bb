#include "generate/request_checks.h"

#include <fmt/format.h>

namespace loom::generate {

RequestFieldNames generate_flag_names() {
  RequestFieldNames names;
  names.prompt = "--prompt";
  names.max_new_tokens = "--max-new-tokens";
  names.min_new_tokens = "--min-new-tokens";
  names.stop_strings = "--stop";
  names.top_logprobs = "top_logprobs";  // no flag: `loom generate` reports no log-probabilities
  return names;
}

RequestError::RequestError(const std::string& field, const std::string& message)
    : std::invalid_argument(field + ": " + message), field_(field), message_(message) {}

void check_request_fields(int64_t max_new_tokens, int64_t min_new_tokens, const std::vector<std::string>& stop_strings,
                          int64_t top_logprobs, const SamplingOptions& sampling, const RequestFieldNames& names) {
  if (max_new_tokens < 0)
    throw RequestError(names.max_new_tokens, fmt::format("expected an integer >= 0, found {}", max_new_tokens));
  if (min_new_tokens < 0)
    throw RequestError(names.min_new_tokens, fmt::format("expected an integer >= 0, found {}", min_new_tokens));
  if (top_logprobs < 0 || top_logprobs > kMaxTopLogprobs)
    throw RequestError(names.top_logprobs,
                       fmt::format("expected an integer in [0, {}], found {}", kMaxTopLogprobs, top_logprobs));
  for (const auto& s : stop_strings)
    if (s.empty()) throw RequestError(names.stop_strings, "expected non-empty strings");
  validate(sampling);
}

void check_prompt_length(int64_t tokens, const ModelBounds& model, const std::string& field) {
  if (tokens > model.context)
    throw RequestError(field, fmt::format("{} tokens, more than the model's context of {} tokens", tokens, model.context));
}

void check_token_budget(int64_t prompt_tokens, int64_t max_new_tokens, const ModelBounds& model,
                        const RequestFieldNames& names) {
  if (model.reserve_max_new_tokens && prompt_tokens + max_new_tokens > model.context)
    throw RequestError(names.max_new_tokens,
                       fmt::format("{} prompt tokens + {} new tokens exceed the model's context of {} tokens",
                                   prompt_tokens, max_new_tokens, model.context));
}

void check_request(const std::vector<int64_t>& prompt, int64_t max_new_tokens, int64_t min_new_tokens,
                   const std::vector<std::string>& stop_strings, int64_t top_logprobs, const SamplingOptions& sampling,
                   const ModelBounds& model, const RequestFieldNames& names) {
  if (prompt.empty()) throw RequestError(names.prompt, "expected at least one token");
  for (int64_t id : prompt)
    if (id < 0 || id >= model.vocab_size)
      throw RequestError(names.prompt,
                         fmt::format("token id {} is outside the vocabulary [0, {})", id, model.vocab_size));
  const int64_t n = static_cast<int64_t>(prompt.size());
  check_prompt_length(n, model, names.prompt);
  check_request_fields(max_new_tokens, min_new_tokens, stop_strings, top_logprobs, sampling, names);
  check_token_budget(n, max_new_tokens, model, names);
}

}  // namespace loom::generate
