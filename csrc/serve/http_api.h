// The request and response bodies of `loom serve` (docs/serving.md): NeMo's text generation
// server (`PUT /generate`: sentences, tokens_to_generate, ... → sentences, tokens, logprob,
// token_ids, offsets) and OpenAI's legacy completions (`POST /v1/completions`: prompt as text,
// texts or token ids, max_tokens, temperature (0: greedy), top_p, top_k, logprobs, echo, seed,
// stop, stream → choices with text, logprobs {tokens, token_logprobs, top_logprobs,
// text_offset}, finish_reason, and usage). Parsing checks every field (type, range, unknown
// names, the counts and sizes of serve/limits.h) and throws ApiError naming it; formatting is
// from the engine's results. Torch-free.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "serve/request.h"

namespace loom::serve {

/// A request the API refuses: HTTP `status` (4xx) and a message naming the field.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string field, const std::string& message)
      : std::runtime_error(field.empty() ? message : field + ": " + message), status_(status), field_(std::move(field)) {}
  int status() const { return status_; }
  const std::string& field() const { return field_; }

 private:
  int status_;
  std::string field_;
};

/// The error body both APIs answer with: {"error": {"message", "type", "param", "code"}}.
nlohmann::json error_body(int status, const std::string& message, const std::string& field = "");

/// Everything a completed request produced (the engine's progress, accumulated).
struct RequestResult {
  std::vector<int64_t> prompt;
  std::vector<double> prompt_logprobs;  ///< when asked; NaN for the first token
  std::vector<std::vector<std::pair<int64_t, double>>> prompt_top;
  std::vector<int64_t> tokens;          ///< generated
  std::vector<double> logprobs;
  std::vector<std::vector<std::pair<int64_t, double>>> top;
  std::string finish_reason;            ///< "length", "stop" or "error" ("" while running)
  std::string error;                    ///< why generation failed (finish_reason "error")
};

struct PromptTasks;   // serve/prompt_requests.h
class ChatTemplate;   // serve/chat_template.h

/// What the model and tokenizer allow, for parsing.
struct ApiContext {
  const data::Tokenizer* tokenizer = nullptr;
  int64_t context = 0;      ///< max_position_embeddings
  std::string model_name;   ///< the base model's id (/v1/models lists it first)
  /// The served LoRA adapters' ids by adapter index (`loom serve --lora NAME=DIR`): OpenAI's
  /// `model` field naming one runs the request with that adapter (RequestSpec::adapter).
  std::vector<std::string> adapters;
  const PromptTasks* prompts = nullptr;  ///< learned prompts (--prompt-checkpoint); null: none
  /// Bytes a prompt text may have (a longer one is refused before it is tokenized); 0: no
  /// limit but the body's. max_prompt_bytes() gives the value `loom serve` uses.
  size_t max_prompt_bytes = 0;
  /// The checkpoint's chat template (POST /v1/chat/completions); null: chat requests are refused.
  const ChatTemplate* chat_template = nullptr;
};

/// context × the bytes of the tokenizer's longest token: no prompt text longer than this can
/// fit the context (limits.h).
size_t max_prompt_bytes(const data::Tokenizer& tokenizer, int64_t context);

/// Parses a request body as JSON, refusing (ApiError 400) malformed JSON and invalid UTF-8
/// (`body`), nesting deeper than limits::kMaxJsonDepth (naming the body's field that holds it)
/// and numbers past a double's range (naming where: "stream_options.include_usage").
/// The depth is checked while parsing, before anything walks the value recursively.
nlohmann::json parse_request_body(const std::string& body);

/// The fields OpenAI's completions and chat completions share, checked in this order
/// (ApiError naming the field): `model` (the base's id or a served adapter's: 404 naming
/// the served ids for another; it sets base.adapter), `user`, `n` and `best_of` (1),
/// `presence_penalty` and `frequency_penalty` (0), `logit_bias` (empty), `stream`,
/// `stream_options.include_usage`, the token budget (`max_tokens_field`: 16 by default, 0 allowed),
/// `temperature` (1; 0 = greedy), `top_p`, `top_k`, `repetition_penalty`, `seed` (a random one
/// when absent), `min_tokens`, `stop`. The request template `base` has no prompt yet.
struct OpenAiCommon {
  RequestSpec base;
  std::string model;  ///< the id the request chose (the base's when absent), reported back
  bool stream = false;
  bool include_usage = false;  ///< stream_options.include_usage
};
OpenAiCommon parse_openai_common(const nlohmann::json& body, const ApiContext& api, const char* max_tokens_field);
/// A prompt text's token ids (refused past ApiContext::max_prompt_bytes before tokenizing; an
/// empty text is the document-start token), as /v1/completions tokenizes a text prompt.
std::vector<int64_t> encode_prompt_text(const std::string& text, const ApiContext& api, const char* field);
/// Refuses (400) a prompt past the context, or whose budget of `max_tokens` does not fit.
void check_prompt_fits(const std::vector<int64_t>& prompt, int64_t max_tokens, const ApiContext& api,
                       const char* length_field, const char* prompt_field);
/// The text of one token (the logprobs' `tokens` entries).
std::string token_text(int64_t id, const data::Tokenizer& tokenizer);

/// A parsed POST /v1/completions.
struct CompletionJob {
  std::vector<RequestSpec> specs;  ///< one per prompt
  bool stream = false;
  bool echo = false;
  int64_t logprobs = -1;           ///< -1: none; n >= 0: token log-probabilities and n alternatives
  bool include_usage = false;      ///< stream_options.include_usage
  std::string model;               ///< the model id the request chose (OpenAiCommon::model)
};

/// Parses a completions body (throws ApiError naming the field). With `taskname` (a task of
/// the learned prompts, by name or index), `prompt` is a record (an object of the task's
/// template fields) or a list of records, laid out as serve/prompt_requests.h says; `echo`
/// is refused then.
CompletionJob parse_completion(const nlohmann::json& body, const ApiContext& api);

/// The choice of prompt `index` ({"text", "index", "logprobs", "finish_reason"}).
nlohmann::json completion_choice(const CompletionJob& job, size_t index, const RequestResult& result,
                                 const ApiContext& api);
/// The logprobs object of prompt `index` ({"tokens", "token_logprobs", "top_logprobs",
/// "text_offset"}): the echoed prompt's tokens, then the generated ones up to the stop string's
/// cut; text_offset is each token's byte offset in the choice's text.
nlohmann::json completion_logprobs(const CompletionJob& job, size_t index, const RequestResult& result,
                                   const ApiContext& api);
/// How many leading entries of a logprobs object end within the first `bytes` of the text
/// (the tokens a stream may send once it sent those bytes).
size_t logprob_entries_within(const nlohmann::json& logprobs, size_t bytes);
/// Entries [first, last) of a logprobs object, the same four lists (a streamed chunk's part;
/// text_offset stays relative to the whole text, as OpenAI's stream reports it).
nlohmann::json logprob_entries(const nlohmann::json& logprobs, size_t first, size_t last);
/// The whole (non-streamed) response.
nlohmann::json completion_response(const CompletionJob& job, const std::vector<RequestResult>& results,
                                   const ApiContext& api, const std::string& id, int64_t created);
/// {"prompt_tokens", "completion_tokens", "total_tokens"}.
nlohmann::json usage(const std::vector<RequestResult>& results);

/// A parsed PUT /generate (NeMo).
struct NemoJob {
  std::vector<RequestSpec> specs;  ///< one per sentence
  bool compute_logprob = false;
  bool all_probs = false;
};

/// Parses a NeMo generate body (throws ApiError naming the field). `task_ids` (one per
/// sentence: a task name or index of the learned prompts, or null for a plain sentence) makes
/// each such sentence a record of its task's template fields (serve/prompt_requests.h).
NemoJob parse_nemo(const nlohmann::json& body, const ApiContext& api);
/// NeMo's response (a learned-prompt request shows its prompt without the virtual positions):
/// sentences (prompt + generated text), tokens (the token strings),
/// logprob (per token after the first, when compute_logprob), token_ids, offsets (the
/// characters' start of each token in its sentence); full_logprob (the top alternatives here)
/// when all_probs.
nlohmann::json nemo_response(const NemoJob& job, const std::vector<RequestResult>& results, const ApiContext& api);

/// The bytes of the generated text: the tokens decoded, cut before the first stop string.
std::string generated_text(const RequestSpec& spec, const RequestResult& result, const data::Tokenizer& tokenizer);

/// How many leading bytes of `text` can be streamed now: the rest could still become a stop
/// string or is an incomplete UTF-8 character.
size_t streamable_prefix(const std::string& text, const std::vector<std::string>& stop_strings);

/// JSON text of `value` with invalid UTF-8 (a token may end inside a character) replaced.
std::string dump_json(const nlohmann::json& value);
/// The start of dump_json(value) for an error message (at most 80 bytes, then "...").
std::string excerpt(const nlohmann::json& value);

}  // namespace loom::serve
