// GPT input embedding: vocab-parallel word embedding + learned absolute positions (none with
// rotary positions, which act in attention) + embedding dropout (docs/design/parallel_layout.md, "Vocab-parallel embedding"). Rank r owns word rows
// [r·V/t, (r+1)·V/t) of the padded vocabulary; out-of-range ids give zero rows; the partial
// sums are all-reduced, or reduce-scattered into the sequence-parallel layout.
#pragma once
#include <ATen/core/Tensor.h>

#include "model/dropout_context.h"
#include "model/gpt_config.h"
#include "model/parameter.h"
#include "model/prompt_splice.h"
#include "runtime/communicator.h"

namespace loom::model {

class GptEmbedding {
 public:
  GptEmbedding(const GptConfig& config, runtime::CommunicatorPtr tp,
               const at::TensorOptions& options);
  /// tokens, position_ids [b, s] int64 -> [s, b, h], or [s/t, b, h] (this rank's sequence
  /// shard) under sequence parallelism. Throws std::invalid_argument for a token id outside
  /// [0, vocab_size) or a position outside [0, max_position_embeddings) when the ids are host
  /// tensors (ids on a device are not read back: the caller checks them where it made them).
  /// With an active `prompt`, its vectors replace the word embeddings at its positions
  /// (prompt_splice.h); the token ids there are looked up as usual (use the pad id).
  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& position_ids,
                     const DropoutContext& dropout, const PromptSplice& prompt = {}) const;
  /// This rank's word-embedding shard [V_padded/t, h] (tied to the output layer).
  const at::Tensor& word_weight() const { return word_; }
  void collect(ParamList& out) const;

  /// The full word embedding [V_padded, h] every layout starts from (pad rows zero).
  static at::Tensor initial_word_weight(const GptConfig& config, int tensor_parallel);

 private:
  GptConfig config_;
  runtime::CommunicatorPtr tp_;
  at::Tensor word_, position_;  ///< position_ undefined with rotary positions
};

}  // namespace loom::model
