// A model parameter as the training step sees it: the tensor plus the facts that decide how its
// gradient is reduced, counted in the norm and decayed (parallel_layout.md, "Gradient
// finalisation"). The model fills these when it builds a pipeline stage.
#pragma once
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace loom::train {

struct TrainableParam {
  std::string name;  ///< e.g. "layers.3.attention.qkv.weight" (global layer index)
  at::Tensor param;  ///< the model's parameter (requires_grad), model dtype
  /// A distinct shard on every tensor rank (column/row-parallel weights, vocab-parallel
  /// embedding). false: replicated across the tensor group.
  bool tensor_parallel = false;
  /// Replicated, but each tensor rank only sees its sequence shard under SP (LayerNorm weights,
  /// row-parallel biases): the gradient is SUM all-reduced over the tensor group.
  bool sequence_parallel = false;
  /// The word-embedding copy held by the last pipeline stage for the tied output layer
  /// (p > 1): gradients are summed with the first stage's copy; counted once in the norm.
  bool tied_embedding_duplicate = false;
  /// The word embedding on either end stage (both copies): member of the embedding group sum.
  bool word_embedding = false;
  /// AdamW weight decay applies (false for biases and LayerNorm parameters).
  bool weight_decay = true;
};

using TrainableParams = std::vector<TrainableParam>;

}  // namespace loom::train
