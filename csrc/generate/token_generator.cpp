#include "generate/token_generator.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "generate/request_checks.h"
#include "generate/sampling_batch.h"
#include "model/kv_cache.h"
#include "model/mappings.h"

namespace loom::generate {

at::Tensor gather_vocab_logits(const at::Tensor& local, const runtime::CommunicatorPtr& tp, int64_t vocab_size) {
  at::NoGradGuard no_grad;
  const at::Tensor full = model::gather_from_tensor_model_parallel_region(local.contiguous(), tp);  // [rows, V_pad]
  if (full.size(-1) < vocab_size)
    throw std::invalid_argument("gather_vocab_logits: " + std::to_string(full.size(-1)) +
                                " gathered logits for a vocabulary of " + std::to_string(vocab_size));
  return full.narrow(-1, 0, vocab_size).to(at::kCPU, at::kFloat).contiguous();
}

at::Tensor gather_last_logits(const at::Tensor& local_logits, const runtime::CommunicatorPtr& tp,
                              int64_t vocab_size) {
  if (local_logits.dim() != 3 || local_logits.size(0) < 1)
    throw std::invalid_argument("gather_last_logits: expected logits [n, b, V/t], found " +
                                c10::str(local_logits.sizes()));
  return gather_vocab_logits(local_logits.select(0, local_logits.size(0) - 1), tp, vocab_size);  // [b, V]
}

GenerationResult generate_tokens(const model::GptStage& model, const runtime::CommunicatorPtr& tp,
                                 const std::vector<int64_t>& prompt,
                                 const GenerationOptions& options,
                                 const model::PromptSplice& virtual_tokens) {
  const auto& config = model.config();
  const int64_t n = static_cast<int64_t>(prompt.size());
  // The context bounds the generation (kContextFull), not the request.
  const ModelBounds bounds{config.vocab_size, config.max_position_embeddings, /*reserve_max_new_tokens=*/false};
  check_request(prompt, options.max_new_tokens, options.min_new_tokens, {}, 0, options.sampling, bounds,
                generate_flag_names());
  TokenSampler sampler(options.sampling);

  GenerationResult result;
  if (options.max_new_tokens == 0) return result;
  // The last token is sampled, never run: n + max_new - 1 positions at most.
  const int64_t capacity =
      std::min(config.max_position_embeddings, n + options.max_new_tokens - 1);
  model::KvCache cache = model.make_kv_cache(1, std::max(capacity, n));
  const auto on_device = at::TensorOptions().dtype(at::kLong).device(tp->device());
  at::Tensor logits = model.forward_cached(at::tensor(prompt, on_device).unsqueeze(0), cache, virtual_tokens);
  std::vector<int64_t> context = prompt;  // for the repetition penalty
  while (true) {
    SampleRow row;
    row.options = options.sampling;
    row.penalized = &context;
    row.banned_token = static_cast<int64_t>(result.tokens.size()) < options.min_new_tokens ? options.stop_token : -1;
    row.uniform = options.sampling.greedy ? 0.0 : sampler.draw_uniform();
    row.logprob = false;  // loom generate reports tokens only
    const SampledRows chosen = sample_rows(gather_last_logits(logits, tp, config.vocab_size), {row});  // [1, V]
    if (!chosen.errors[0].empty()) throw std::invalid_argument(chosen.errors[0]);
    const int64_t token = chosen.tokens[0];
    if (token == options.stop_token) {
      result.reason = StopReason::kStopToken;
      break;
    }
    result.tokens.push_back(token);
    context.push_back(token);
    if (options.stop_when && options.stop_when(result.tokens)) {
      result.reason = StopReason::kStopString;
      break;
    }
    if (static_cast<int64_t>(result.tokens.size()) == options.max_new_tokens) {
      result.reason = StopReason::kMaxNewTokens;
      break;
    }
    if (cache.length() >= config.max_position_embeddings) {
      result.reason = StopReason::kContextFull;
      break;
    }
    logits = model.forward_cached(at::tensor(std::vector<int64_t>{token}, on_device).unsqueeze(0), cache);
  }
  return result;
}

}  // namespace loom::generate
