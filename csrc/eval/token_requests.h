// The token sequences lm-evaluation-harness's `hf` model scores for each request
// (lm_eval/api/model.py _encode_pair and loglikelihood, models/huggingface.py
// _loglikelihood_tokens and loglikelihood_rolling, utils.py get_rolling_token_windows;
// docs/design/evaluation.md, "Requests"):
// - (context, continuation): trailing whitespace of the context moves to the continuation;
//   context + continuation is encoded whole and the continuation's tokens are those past the
//   context's own encoding; an empty context is replaced by the prefix token (data::document_start_id: GPT-2 <|endoftext|>);
//   the sequence is left-truncated to max_length + 1 tokens.
// - rolling: the document's tokens in disjoint windows of max_length predictions, the first
//   conditioned on the prefix token, each later one on the max_length − n tokens before its n.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace loom::eval {

/// One forward pass's worth of scoring: input = tokens[0, n−1), labels = tokens[1, n); the
/// last `scored` labels are the continuation (1 <= scored < n <= max_length + 1).
struct TokenRequest {
  std::vector<int64_t> tokens;
  int64_t scored = 0;
};

/// The continuation's tokens after `context` (the harness's rules above), truncated to
/// max_length + 1. Throws EvalInputError (the message starting with `where`) when the
/// continuation encodes to no tokens or to more than max_length.
TokenRequest continuation_request(const std::string& context, const std::string& continuation,
                                  const data::Tokenizer& tokenizer, int64_t prefix_token, int64_t max_length,
                                  const std::string& where);

/// The rolling windows of `text` (none for an empty text). Their scored tokens together are
/// every token of the text, each once.
std::vector<TokenRequest> rolling_requests(const std::string& text, const data::Tokenizer& tokenizer,
                                           int64_t prefix_token, int64_t max_length);

}  // namespace loom::eval
