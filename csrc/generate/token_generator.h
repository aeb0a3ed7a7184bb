// Autoregressive generation with a key/value cache on a tensor-parallel whole-model stage:
// the prompt is run once (prefill), then one token per step. Each step's vocab-parallel
// logits of the last position are all-gathered to the full unpadded vocabulary on every TP
// rank and sample_rows (sampling_batch.h, the serving engine's sampler) picks the token with
// the uniform of a TokenSampler seeded alike on every rank, so all ranks
// (and every t, up to floating-point rounding of the logits) produce the same tokens.
#pragma once
#include <functional>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "generate/sampling.h"
#include "generate/stop_reason.h"
#include "model/gpt_stage.h"
#include "runtime/communicator.h"

namespace loom::generate {

/// The full-vocabulary logits of some positions, the one gather of `loom generate` and the
/// serving engine: this rank's vocabulary shard `local` [rows, V_padded/t] -> [rows,
/// vocab_size] float32 on the CPU, identical on every rank of `tp` (collective). Throws
/// std::invalid_argument when the gathered vocabulary is smaller than vocab_size.
at::Tensor gather_vocab_logits(const at::Tensor& local, const runtime::CommunicatorPtr& tp, int64_t vocab_size);

/// The full-vocabulary logits of the last position: local logits [n, b, V_padded/t] ->
/// [b, vocab_size] float32 on the CPU, identical on every rank of `tp` (collective).
at::Tensor gather_last_logits(const at::Tensor& local_logits, const runtime::CommunicatorPtr& tp,
                              int64_t vocab_size);

struct GenerationOptions {
  int64_t max_new_tokens = 32;
  int64_t stop_token = -1;  ///< e.g. <|endoftext|>; -1: none
  /// The stop token cannot be drawn before this many new tokens (its logit is -inf until then).
  int64_t min_new_tokens = 0;
  SamplingOptions sampling;
  /// Called with the new tokens after each one; true ends generation (kStopString), e.g. when
  /// their text contains a stop string (the caller decodes and trims).
  std::function<bool(const std::vector<int64_t>&)> stop_when;
};

struct GenerationResult {
  std::vector<int64_t> tokens;  ///< the new tokens (the stop token excluded)
  StopReason reason = StopReason::kMaxNewTokens;
};

/// Generates up to max_new_tokens after `prompt` (non-empty ids in [0, vocab_size)); stops
/// early at stop_token or when the next token would need a position past
/// max_position_embeddings (kContextFull). Collective over `tp` (the model's TP group): every
/// rank passes the same prompt and options. Throws RequestError (request_checks.h, a
/// std::invalid_argument) for an empty prompt, one longer than max_position_embeddings, bad
/// ids or negative token counts, std::invalid_argument for bad sampling options.
/// An active `virtual_tokens` splice (prompt learning, model/prompt_splice.h) is applied to the
/// prompt's positions in the prefill (its seq_index counts from the prompt's first token).
GenerationResult generate_tokens(const model::GptStage& model, const runtime::CommunicatorPtr& tp,
                                 const std::vector<int64_t>& prompt,
                                 const GenerationOptions& options,
                                 const model::PromptSplice& virtual_tokens = {});

}  // namespace loom::generate
