// Key/value cache for incremental (autoregressive) decoding with a tensor-parallel GPT stage.
// Each layer keeps the keys and values of every position seen so far for this rank's heads,
// so a new token attends to the whole prefix without recomputing it: prefill the prompt in
// one call, then feed one token per call (GptStage::forward_cached). Attention of the n new
// queries over the L + n cached keys uses the offset causal mask of
// loom::ops::scaled_masked_softmax (key j hidden from query i when j > i + L), which gives
// exactly the rows of the full causal forward over the same sequence.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace loom::model {

class KvCache {
 public:
  /// Buffers for global layers [first_layer, first_layer + num_layers), each key and value
  /// [batch, heads_local, capacity, head_dim] of `options` (dtype, device), zero-filled.
  /// Throws std::invalid_argument for a non-positive size.
  KvCache(int first_layer, int num_layers, int64_t batch, int64_t heads_local, int64_t head_dim,
          int64_t capacity, const at::TensorOptions& options);

  int64_t length() const { return length_; }      ///< positions committed so far
  int64_t capacity() const { return capacity_; }  ///< most positions the cache can hold
  int64_t batch() const { return batch_; }

  /// Stores k, v [batch, heads_local, n, head_dim] at positions [length, length + n) of global
  /// layer `layer` and returns views of that layer's keys and values at [0, length + n).
  /// Throws std::out_of_range when the layer is not cached here or length + n > capacity,
  /// std::invalid_argument on a shape mismatch.
  std::pair<at::Tensor, at::Tensor> append(int layer, const at::Tensor& k, const at::Tensor& v);

  /// Commits n positions once every layer has appended them. Throws std::out_of_range past
  /// the capacity.
  void advance(int64_t n);
  /// Forgets every position (the buffers are reused).
  void reset() { length_ = 0; }

 private:
  int first_layer_;
  int64_t batch_, heads_local_, head_dim_, capacity_;
  int64_t length_ = 0;
  std::vector<at::Tensor> keys_, values_;
};

}  // namespace loom::model
