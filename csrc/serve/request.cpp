#include "serve/request.h"

#include <stdexcept>

namespace loom::serve {

int64_t kv_tokens(const RequestSpec& spec) {
  return static_cast<int64_t>(spec.prompt.size()) + spec.max_new_tokens;
}

nlohmann::json to_json(const RequestSpec& s) {
  const auto& o = s.sampling;
  return {{"prompt", s.prompt},
          {"max_new_tokens", s.max_new_tokens},
          {"min_new_tokens", s.min_new_tokens},
          {"greedy", o.greedy},
          {"temperature", o.temperature},
          {"top_k", o.top_k},
          {"top_p", o.top_p},
          {"seed", o.seed},
          {"repetition_penalty", o.repetition_penalty},
          {"stop_at_eod", s.stop_at_eod},
          {"stop_strings", s.stop_strings},
          {"logprobs", s.logprobs},
          {"top_logprobs", s.top_logprobs},
          {"prompt_logprobs", s.prompt_logprobs},
          {"prompt_task", s.prompt_task},
          {"virtual_positions", s.virtual_positions},
          {"adapter", s.adapter}};
}

RequestSpec request_from_json(const nlohmann::json& j) {
  try {
    RequestSpec s;
    s.prompt = j.at("prompt").get<std::vector<int64_t>>();
    s.max_new_tokens = j.at("max_new_tokens").get<int64_t>();
    s.min_new_tokens = j.at("min_new_tokens").get<int64_t>();
    s.sampling.greedy = j.at("greedy").get<bool>();
    s.sampling.temperature = j.at("temperature").get<double>();
    s.sampling.top_k = j.at("top_k").get<int64_t>();
    s.sampling.top_p = j.at("top_p").get<double>();
    s.sampling.seed = j.at("seed").get<uint64_t>();
    s.sampling.repetition_penalty = j.at("repetition_penalty").get<double>();
    s.stop_at_eod = j.at("stop_at_eod").get<bool>();
    s.stop_strings = j.at("stop_strings").get<std::vector<std::string>>();
    s.logprobs = j.at("logprobs").get<bool>();
    s.top_logprobs = j.at("top_logprobs").get<int64_t>();
    s.prompt_logprobs = j.at("prompt_logprobs").get<bool>();
    s.prompt_task = j.at("prompt_task").get<int64_t>();
    s.virtual_positions = j.at("virtual_positions").get<std::vector<int64_t>>();
    s.adapter = j.at("adapter").get<int64_t>();
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(std::string("serve: malformed engine request message: ") + e.what());
  }
}

}  // namespace loom::serve
