// Gradient finalisation after the last micro-batch backward (docs/design/parallel_layout.md, "Gradient
// finalisation"; Megatron-Core finalize_model_grads), on the fp32 main gradients of a GradBuffer:
//   1. data-parallel reduction, scaled 1/d: bucketed SUM all-reduce, or reduce-scatter for the
//      distributed optimizer (then only this rank's shard of each bucket is the reduced value);
//   2. SUM all-reduce over the tensor group of the grads of sequence_parallel parameters
//      (docs/design/sp_sar.md: LayerNorm weights/biases and row-parallel biases see only local tokens);
//   3. SUM all-reduce over the embedding group of the word_embedding grads (tied input/output
//      embedding on the first and last pipeline stage, p > 1), so both copies end identical.
// All sums are linear, so the order changes only rounding. With reduce-scatter, steps 2 and 3
// run *before* step 1, bucket by bucket (steps 2 and 3 of bucket b, then its reduce-scatter):
// the two embedding copies sit at different buffer offsets on the first and last stage, so after
// a reduce-scatter the element a rank owns on one stage can be one that its peer on the other
// stage holds unreduced. The per-bucket functions below are the units both the finalisation
// after backward and the overlapped reduction (grad_overlap.h) run, so both reduce every
// element in the same collectives and order, bit for bit.
#pragma once
#include <memory>

#include "runtime/communicator.h"
#include "train/optim/grad_buffer.h"

namespace loom::train::optim {

/// One bucket's data-parallel collective in flight. wait() completes it (with reduce-scatter,
/// copies this rank's reduced shard into its place in the bucket); idempotent.
class BucketReduction {
 public:
  BucketReduction() = default;
  BucketReduction(std::unique_ptr<runtime::AsyncWork> work, at::Tensor shard, at::Tensor destination);
  void wait();
  bool started() const { return static_cast<bool>(work_); }

 private:
  std::unique_ptr<runtime::AsyncWork> work_;
  at::Tensor shard_, destination_;  // reduce-scatter only: the received shard and where it goes
  bool done_ = false;
};

/// Step 1 for bucket `b`: multiplies it by 1/d and starts its SUM all-reduce (or reduce-scatter,
/// see reduce_data_parallel_grads) on `data`. d = 1: nothing to do (a completed reduction).
BucketReduction start_bucket_reduction(GradBuffer& grads, size_t b, runtime::Communicator& data,
                                       bool reduce_scatter);

/// Steps 2 and 3 for the parameters of bucket `b` only (one packed all-reduce each): the
/// distributed optimizer's order, before the bucket's reduce-scatter.
void all_reduce_bucket_replicated_grads(GradBuffer& grads, size_t b, runtime::Communicator& tensor,
                                        runtime::Communicator& embedding);

/// Whether bucket `b` holds a word_embedding gradient that `embedding` (size > 1) must reduce:
/// its step 3 waits for the other end stage, so it cannot run inside this stage's backward.
bool bucket_needs_embedding_reduction(const GradBuffer& grads, size_t b, const runtime::Communicator& embedding);

/// Step 1. Every bucket is multiplied by 1/data.size() then SUM all-reduced in place (or, with
/// `reduce_scatter`, reduce-scattered: rank r of the data group receives elements
/// [r·n/d, (r+1)·n/d) of each bucket of n elements, written back in place; the rest of the
/// bucket keeps this rank's local values). Buckets must be padded to a multiple of d for
/// reduce-scatter (std::invalid_argument otherwise). No-op (no scaling) when d = 1.
void reduce_data_parallel_grads(GradBuffer& grads, runtime::Communicator& data, bool reduce_scatter);

/// Step 2. One SUM all-reduce of all sequence_parallel grads packed together. No-op when t = 1
/// or there are none.
void all_reduce_sequence_parallel_grads(GradBuffer& grads, runtime::Communicator& tensor);

/// Step 3. SUM all-reduce of the word_embedding grads over `embedding` (size 1 off the end
/// stages and when p = 1: no-op).
void all_reduce_word_embedding_grads(GradBuffer& grads, runtime::Communicator& embedding);

/// Steps 1–3 in the order described above (per bucket with reduce_scatter).
void finalize_grads(GradBuffer& grads, runtime::Communicator& data, runtime::Communicator& tensor,
                    runtime::Communicator& embedding, bool reduce_scatter);

}  // namespace loom::train::optim
