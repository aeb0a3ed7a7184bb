// The fp32 gradient buffer of one pipeline stage (Megatron's "main_grad" buffer): every
// parameter's gradient lives in one contiguous fp32 tensor, in backprop order (the reverse of
// the parameter list), cut into buckets for the data-parallel collectives
// (docs/design/parallel_layout.md, "Gradient finalisation" and "Distributed optimizer").
//
// Gradient accumulation over micro-batches is in fp32 whatever the model dtype: after each
// micro-batch backward the loop calls accumulate(), which adds every param.grad (fp32, bf16 or
// fp16) into its fp32 main_grad and then drops param.grad, so autograd starts the next
// micro-batch from an undefined .grad. Parameters without a .grad (unused) are skipped.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "model/parameter.h"

namespace loom::train::optim {

struct GradBufferOptions {
  /// A bucket is closed once it holds at least this many bytes of fp32 gradients (a parameter
  /// is never split across buckets). Megatron's default bucket is 40 MB.
  int64_t bucket_bytes = 40'000'000;
  /// Each bucket's element count is padded (with zeros) to a multiple of this: the data-parallel
  /// size for the distributed optimizer, which shards every bucket into equal parts.
  int64_t pad_multiple = 1;
  /// Where the buffer lives: the run's device. Every parameter must be on it; a stage with no
  /// parameters to train (prompt learning's later pipeline stages) gets an empty buffer there.
  at::Device device = at::kCPU;
};

struct GradBucket {
  int64_t offset = 0;  ///< first element in the buffer
  int64_t numel = 0;   ///< elements including padding (a multiple of pad_multiple)
  std::vector<size_t> params;  ///< parameter indices, in buffer order
};

class GradBuffer {
 public:
  /// All parameters must be floating point on options.device and have distinct tensors.
  /// Throws std::invalid_argument naming the parameter otherwise, or for bucket_bytes < 1 or
  /// pad_multiple < 1.
  GradBuffer(model::ParamList params, GradBufferOptions options = {});

  const model::ParamList& params() const { return params_; }
  /// The whole buffer: 1-D fp32 on options.device (empty when there are no parameters).
  const at::Tensor& data() const { return data_; }
  /// Parameter i's fp32 gradient: a view of data(), shaped like the parameter.
  at::Tensor main_grad(size_t i) const;
  int64_t offset(size_t i) const { return offsets_.at(i); }  ///< first element of parameter i
  const std::vector<GradBucket>& buckets() const { return buckets_; }
  at::Tensor bucket_view(size_t b) const;  ///< 1-D view of bucket b (padding included)

  /// main_grad(i) += params[i].tensor.grad() for every parameter that has one (cast to fp32),
  /// then resets each param.grad to undefined. Call after every micro-batch backward.
  void accumulate();
  /// Zeros the buffer and resets every param.grad (start of an iteration).
  void zero();

 private:
  model::ParamList params_;
  GradBufferOptions options_;
  at::Tensor data_;
  std::vector<int64_t> offsets_;
  std::vector<GradBucket> buckets_;
};

}  // namespace loom::train::optim
