// Speculative decoding's draft model (docs/serving.md, "Speculative decoding"): a smaller
// model with the target's vocabulary, whole on every rank (t = 1, replicated: every rank runs
// the same draft computation and so proposes the same tokens, no messages), with its own paged
// KV cache of one fixed run of blocks per engine row. Each step it catches a request up on the
// context the draft has not seen, then drafts k tokens one forward at a time, sampling each
// from its own distribution q under the request's sampling options (penalty over the context
// and the drafts so far, banned stop token, temperature, top-k, top-p) with the request's
// draft uniforms; the engine verifies them against the target's p (generate/sampling_batch.h).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "generate/sampling.h"
#include "model/gpt_stage.h"
#include "model/kv_cache.h"

namespace loom::serve {

/// One request's draft of this step.
struct DraftJob {
  int64_t row = 0;                            ///< the engine's cache row (the draft cache's too)
  const std::vector<int64_t>* context = nullptr;  ///< prompt and generated tokens
  int64_t k = 0;                              ///< tokens to draft (>= 1)
  generate::SamplingOptions options;
  int64_t banned_until = 0;                   ///< drafted token j (0-based) is banned_token while j < banned_until
  int64_t banned_token = -1;
  std::function<double(int64_t)> uniform;     ///< the uniform of drafted token j (unused when greedy)
  std::vector<int64_t> tokens;                ///< out: the k drafted tokens
  std::vector<at::Tensor> probs;              ///< out: q of each, [V] float64 on the model's device
};

class DraftModel {
 public:
  /// `model` (kept by reference): a whole model (pre- and post-process) at t = 1 whose
  /// vocab_size is `target_vocab`; `rows` cache rows of `context` positions each. Throws
  /// std::invalid_argument naming --draft-checkpoint for a vocabulary that differs (the
  /// tokenizers must agree) or a model that is not whole.
  DraftModel(const model::GptStage& model, int64_t rows, int64_t context, int64_t target_vocab);

  /// Drafts every job (their rows distinct): each forward runs one flat batch over the jobs
  /// still drafting.
  void draft(std::vector<DraftJob>& jobs);
  /// The row keeps its first `positions` positions (the target accepted that many).
  void keep(int64_t row, int64_t positions);
  /// The row's request left (or was preempted): it starts over.
  void reset(int64_t row) { keep(row, 0); }

 private:
  const model::GptStage& model_;
  int64_t blocks_per_row_;
  model::KvCache cache_;
  std::vector<int64_t> computed_;  // per row: positions whose keys and values the draft holds
};

}  // namespace loom::serve
