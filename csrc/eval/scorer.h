// Forward-only scoring of token requests on this rank's stage of the model, under any
// tensor/pipeline/data-parallel layout (docs/design/evaluation.md, "Running under t, p, d"):
// - requests are sorted longest first (ties by their tokens, as the harness's Collator does)
//   and cut into batches of `batch_size`; batch k goes to data-parallel replica k mod d;
// - a batch is right-padded to its longest input: under the causal mask padding after a
//   sequence never reaches its positions, so a batched score equals the one-at-a-time score
//   (up to floating-point rounding of different GEMM shapes);
// - pipeline stages run the batches in order, each stage passing its hidden [s, b, h] to the
//   next over pipeline_links (non-blocking sends, so stages overlap across batches);
// - the last stage takes only the scored positions' vocab-parallel logits and computes
//   log p(label) (vocab-parallel cross entropy) and is-argmax (model/vocab_parallel_argmax.h);
// - every replica's results are summed into one [N, 2] host tensor over host_world (each row
//   written by exactly one rank, zeros elsewhere), so every rank returns every score in the
//   requests' own order, whatever the layout.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "eval/metrics.h"
#include "eval/token_requests.h"
#include "model/gpt_stage.h"
#include "runtime/process_groups.h"

namespace loom::eval {

/// Called on every rank before its first batch (done = 0) and after each of its batches:
/// (requests this replica has run, requests of this replica in all).
using ScoringProgress = std::function<void(int64_t done, int64_t total)>;

/// What scoring `requests` costs over all replicas: the forward passes of every batch at its
/// padded length (docs/design/evaluation.md, "Cost").
struct ScoringCost {
  int64_t requests = 0;
  int64_t batches = 0;
  int64_t positions = 0;  ///< Σ over batches of b · s (padding included)
  double flops = 0;       ///< forward FLOPs (ModelShape::model_flops_per_sample / 3 per sequence)
};
ScoringCost scoring_cost(const std::vector<TokenRequest>& requests, int64_t batch_size, const model::GptConfig& config);

/// Scores of `requests` (the same list on every rank; every request non-empty and at most
/// max_position_embeddings + 1 tokens) in their order: Σ log p of the scored tokens and
/// whether each was the argmax. `stage` is this rank's pipeline stage (stage p of the
/// groups' pipeline, sliced for its tensor rank). Collective over the whole world.
std::vector<RequestScore> score_requests(const model::GptStage& stage, runtime::ProcessGroups& groups,
                                         const std::vector<TokenRequest>& requests, int64_t batch_size,
                                         const ScoringProgress& progress = {});

}  // namespace loom::eval
