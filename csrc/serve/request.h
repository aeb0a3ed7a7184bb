// One generation request as the engine runs it (engine.h), whichever API it came from
// (http_api.h): the prompt's token ids, how many tokens to generate, how to choose them, when
// to stop and which log-probabilities to report. Torch-free; it travels from the serving rank
// to every other rank as JSON (to_json / request_from_json), so all ranks run the same request.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "generate/sampling.h"

namespace loom::serve {

struct RequestSpec {
  std::vector<int64_t> prompt;            ///< token ids, non-empty, in [0, vocab)
  int64_t max_new_tokens = 16;            ///< >= 0; prompt + max_new_tokens <= the context
  int64_t min_new_tokens = 0;             ///< the stop token cannot come before this many
  generate::SamplingOptions sampling;     ///< greedy / temperature / top-k / top-p / seed / penalty
  bool stop_at_eod = true;                ///< <|endoftext|> ends the request (it is not returned)
  std::vector<std::string> stop_strings;  ///< the text ends before the first one (also ends it)
  bool logprobs = false;                  ///< log-probability of every generated token
  int64_t top_logprobs = 0;               ///< and its n most probable alternatives (0..kMaxTopLogprobs)
  bool prompt_logprobs = false;           ///< log-probabilities of the prompt's tokens (echo)
  /// Learned prompt (`loom serve --prompt-checkpoint`): the index of its task's inference table
  /// in EngineOptions::prompt_tables (-1: a plain request), and the prompt positions that take
  /// the table's rows in order (increasing; as many as the table has rows; the ids there are
  /// the pad id), as prompt_data::make_prompt_example lays out a record.
  int64_t prompt_task = -1;
  std::vector<int64_t> virtual_positions;
  /// Served LoRA adapter (`loom serve --lora`): its index in EngineOptions::lora (-1: the base
  /// model alone). OpenAI's `model` field chooses it.
  int64_t adapter = -1;
};

/// Positions a request reserves in the KV cache: its prompt plus every token it may generate.
int64_t kv_tokens(const RequestSpec& spec);

nlohmann::json to_json(const RequestSpec& spec);
/// Inverse of to_json (the engine's own messages: a malformed one is a programming error,
/// std::invalid_argument).
RequestSpec request_from_json(const nlohmann::json& j);

}  // namespace loom::serve
