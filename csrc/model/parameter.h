// A model parameter with what the trainer needs to know about it: which dimension is split
// over the tensor-parallel ranks, whether its gradient must be SUM all-reduced over the TP group
// (sequence parallelism), and whether it is a tied word embedding (docs/design/parallel_layout.md,
// "Gradient finalisation").
#pragma once
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace loom::model {

struct Param {
  /// Megatron-like dotted name with the global layer number, e.g.
  /// "layers.3.self_attention.linear_qkv.weight"; identical on every layout.
  std::string name;
  at::Tensor tensor;           ///< leaf, requires_grad; this rank's shard
  int partition_dim = -1;      ///< dim split over TP ranks; -1: replicated on every TP rank
  /// Replicated parameter whose gradient each TP rank holds only a part of, so it must be SUM
  /// all-reduced over the TP group after backward (train::optim::all_reduce_sequence_parallel_grads):
  /// one used in a sequence-parallel region (each rank's gradient covers only its tokens; set
  /// only when sequence_parallel is on), or the LoRA B of a row-parallel linear at t > 1 (each
  /// rank's gradient comes from its input shard; model/lora.h).
  bool sequence_parallel = false;
  bool word_embedding = false;    ///< the tied input/output word embedding (either copy)
  /// The last pipeline stage's copy of the word embedding (its grad is summed with the first
  /// stage's over the embedding group; count it once in the grad norm).
  bool shared_duplicate = false;
  /// AdamW weight decay applies (Megatron: not to biases and LayerNorm parameters).
  bool weight_decay = true;

  bool tensor_parallel() const { return partition_dim >= 0; }
};

using ParamList = std::vector<Param>;

}  // namespace loom::model
