// OpenAI's chat completions for `loom serve` (`POST /v1/chat/completions`, docs/serving.md,
// "Chat completions"): `messages` (role, content) rendered into one prompt by the checkpoint's
// chat template (serve/chat_template.h), the sampling fields of /v1/completions
// (serve/http_api.h: parse_openai_common), `max_tokens` or `max_completion_tokens` (default:
// the rest of the context), `logprobs` (true/false) with `top_logprobs` (0..20),
// `add_generation_prompt` (vLLM's extension, default true), `stream`. The response is
// OpenAI's: choices[0].message {role: "assistant", content}, finish_reason, logprobs.content
// [{token, logprob, bytes, top_logprobs}], usage; streamed, chunks of object
// "chat.completion.chunk" whose choices carry a `delta` (the role first, then content pieces).
// Torch-free.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "serve/http_api.h"

namespace loom::serve {

/// A parsed chat request: one conversation, one engine request.
struct ChatJob {
  RequestSpec spec;
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;      ///< `logprobs: true`: log-probabilities of the generated tokens
  std::string prompt_text;    ///< the rendered prompt
  std::string model;          ///< the model id the request chose (OpenAiCommon::model)
};

/// Parses a chat body (throws ApiError naming the field: `messages` when the server has no chat
/// template or the template refuses the conversation, `messages[i].role` / `.content` /
/// `.name` for a malformed message, the shared fields as /v1/completions names them). The
/// rendered prompt is tokenized with the template's `bos_token` and `eos_token` texts as their
/// special ids (as Hugging Face tokenizers treat special tokens in a text) and the rest as text.
ChatJob parse_chat(const nlohmann::json& body, const ApiContext& api);

/// The logprobs object's `content` list of `result`'s generated tokens up to the stop string's
/// cut: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}].
nlohmann::json chat_logprobs(const ChatJob& job, const RequestResult& result, const ApiContext& api);
/// How many leading entries of chat_logprobs' list end within the first `bytes` of the text.
size_t chat_logprob_entries_within(const nlohmann::json& content, size_t bytes);

/// The whole (non-streamed) response, object "chat.completion".
nlohmann::json chat_response(const ChatJob& job, const RequestResult& result, const ApiContext& api,
                             const std::string& id, int64_t created);

}  // namespace loom::serve
