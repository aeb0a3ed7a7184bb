// Speculative decoding's options and its draft-free proposer (docs/serving.md, "Speculative
// decoding"; /work/shared/design/serving_v2.md): a decoding request proposes up to k tokens,
// the engine's one forward runs the target over them and its last token (k + 1 query
// positions), and generate/sampling_batch.h's exact rejection sampling keeps the longest
// accepted prefix and one more token, so the output is distributed as without speculation.
// Torch-free; every rank proposes the same drafts from the same context.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace loom::serve {

/// `loom serve --speculative-method` (vLLM's speculative_config names).
enum class SpeculativeMethod {
  kNone,
  kNgram,
  kDraft,  ///< a draft model (--draft-checkpoint; EngineOptions::draft_model)
};

struct SpeculativeOptions {
  SpeculativeMethod method = SpeculativeMethod::kNone;
  int64_t num_tokens = 4;         ///< --num-speculative-tokens: k, drafted tokens per step at most (>= 1)
  int64_t prompt_lookup_min = 2;  ///< --prompt-lookup-min: shortest n-gram matched (>= 1)
  int64_t prompt_lookup_max = 4;  ///< --prompt-lookup-max: longest n-gram matched (>= prompt_lookup_min)
};

/// "none", "ngram" or "draft" (also vLLM's "draft_model") -> the method; std::invalid_argument
/// naming --speculative-method otherwise.
SpeculativeMethod parse_speculative_method(const std::string& name);

/// Throws std::invalid_argument naming the flag: num_tokens < 1, prompt_lookup_min < 1,
/// prompt_lookup_max < prompt_lookup_min.
void validate(const SpeculativeOptions& o);

/// Prompt-lookup drafts (Saxena 2023, "prompt lookup decoding"; vLLM's ngram method): for n
/// from max_n down to min_n, the most recent earlier occurrence of the context's last n tokens
/// that some token follows; returns the k tokens that follow it there (past the context's end,
/// the draft's own tokens: a periodic run continues). Empty when no n-gram recurs (or k < 1).
/// O(|context| · max_n).
std::vector<int64_t> propose_ngram_draft(const std::vector<int64_t>& context, int64_t min_n, int64_t max_n,
                                         int64_t k);

}  // namespace loom::serve
