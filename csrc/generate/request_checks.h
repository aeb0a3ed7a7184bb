// The one check of a generation request, whichever interface it came from: `loom generate`'s
// flags (generate_run.h), generate_tokens, and the serving engine and its HTTP APIs
// (serve/engine.h, serve/http_api.h). The prompt against the model's vocabulary and context,
// the token counts, the stop strings, the number of log-probabilities and the sampling
// options; each interface passes the names its users know the fields by, so that every error
// names the field as the user wrote it. Torch-free.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "generate/sampling.h"

namespace loom::generate {

/// Most probable alternatives a request may ask for per token (OpenAI's `logprobs`; NeMo's
/// `all_probs` returns this many). The one definition: serve/limits.h lists it with the
/// server's other limits.
constexpr int64_t kMaxTopLogprobs = 20;

/// How one interface names a request's fields in its errors.
struct RequestFieldNames {
  std::string prompt = "prompt";
  std::string max_new_tokens = "max_tokens";
  std::string min_new_tokens = "min_tokens";
  std::string stop_strings = "stop";
  std::string top_logprobs = "logprobs";
};

/// `loom generate`'s flags: --prompt, --max-new-tokens, --min-new-tokens, --stop.
RequestFieldNames generate_flag_names();

/// A request the model cannot run. what() is "FIELD: MESSAGE".
class RequestError : public std::invalid_argument {
 public:
  RequestError(const std::string& field, const std::string& message);
  const std::string& field() const { return field_; }
  const std::string& message() const { return message_; }

 private:
  std::string field_, message_;
};

/// What the model takes.
struct ModelBounds {
  int64_t vocab_size = 0;
  int64_t context = 0;  ///< max_position_embeddings
  /// The prompt and every token it may generate must fit the context (the serving engine
  /// reserves them); false: generation stops when the context is full (generate_tokens).
  bool reserve_max_new_tokens = true;
};

/// The fields a request holds before its prompt is known: max_new_tokens >= 0,
/// min_new_tokens >= 0, every stop string non-empty, top_logprobs in [0, kMaxTopLogprobs], and
/// the sampling options (validate(), whose errors name `loom generate`'s flags). Throws
/// RequestError naming the field (std::invalid_argument from validate()).
void check_request_fields(int64_t max_new_tokens, int64_t min_new_tokens, const std::vector<std::string>& stop_strings,
                          int64_t top_logprobs, const SamplingOptions& sampling, const RequestFieldNames& names);

/// A prompt of `tokens` tokens fits the context (checked before a prompt's ids are read, so
/// that a hostile list of a million ids is refused at once). Throws RequestError naming `field`.
void check_prompt_length(int64_t tokens, const ModelBounds& model, const std::string& field);

/// `prompt_tokens` plus `max_new_tokens` fit the context when the model reserves them
/// (ModelBounds::reserve_max_new_tokens). Throws RequestError naming names.max_new_tokens.
void check_token_budget(int64_t prompt_tokens, int64_t max_new_tokens, const ModelBounds& model,
                        const RequestFieldNames& names);

/// The whole request: the prompt non-empty, its ids in [0, vocab_size), at most context
/// tokens; then check_request_fields and check_token_budget. Throws RequestError naming the
/// field (std::invalid_argument for the sampling options).
void check_request(const std::vector<int64_t>& prompt, int64_t max_new_tokens, int64_t min_new_tokens,
                   const std::vector<std::string>& stop_strings, int64_t top_logprobs, const SamplingOptions& sampling,
                   const ModelBounds& model, const RequestFieldNames& names);

}  // namespace loom::generate
