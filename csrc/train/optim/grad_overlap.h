// Data-parallel gradient reduction overlapped with backward (model.optim.overlap_grad_sync;
// Megatron-Core's overlap_grad_reduce; docs/design/parallel_layout.md, "Overlapped gradient
// reduction"). A post-accumulate-grad hook on every parameter folds its .grad into the fp32
// buffer as soon as autograd has accumulated it (the same add the loop's accumulate() does after
// each micro-batch, so the sums are bit for bit the same) and counts the parameter's backward
// passes. When every parameter of a bucket has had its m-th (the last micro-batch's) gradient,
// the bucket's collective starts asynchronously (grad_finalize.h, start_bucket_reduction) while
// backward goes on; finish() starts whatever is left, in bucket order, and waits for all.
//
// Each bucket is reduced by the same collectives, in the same per-bucket order, as
// finalize_grads(): with the plain optimizer the bucket's all-reduce, then (in finish) the packed
// sequence-parallel and word-embedding all-reduces; with the distributed optimizer the bucket's
// sequence-parallel all-reduce (the tensor group runs the same backward in lock step), then its
// reduce-scatter. A bucket holding a word_embedding gradient that the embedding group must
// reduce (p > 1) waits for finish(): that all-reduce meets the other end stage, which may still
// be in its backward. Every data-parallel rank must use the same parameters in every
// micro-batch (true of GPT): the buckets then start in the same order on every member.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/process_groups.h"
#include "train/optim/grad_buffer.h"
#include "train/optim/grad_finalize.h"

namespace loom::train::optim {

class OverlappedGradReduction {
 public:
  /// Installs the hooks on every parameter of `grads` (replacing any post-accumulate-grad hook
  /// they had); `grads` and `groups` must outlive this object, which removes the hooks.
  OverlappedGradReduction(GradBuffer& grads, runtime::ProcessGroups& groups, bool reduce_scatter);
  ~OverlappedGradReduction();
  OverlappedGradReduction(const OverlappedGradReduction&) = delete;
  OverlappedGradReduction& operator=(const OverlappedGradReduction&) = delete;

  /// Arms the hooks for one iteration of `num_microbatches` backward passes per parameter
  /// (after GradBuffer::zero()). Throws std::invalid_argument for num_microbatches < 1.
  void begin(int num_microbatches);
  /// Whether begin() was called and finish() not yet.
  bool armed() const { return armed_; }
  /// After the last backward: starts the buckets not yet started, in bucket order, waits for
  /// every bucket, then runs the plain optimizer's packed sequence-parallel and embedding
  /// all-reduces. The gradients then equal finalize_grads()'s. Disarms the hooks.
  void finish();
  /// Buckets whose collective started inside backward in the last iteration (for tests).
  int started_in_backward() const { return started_in_backward_; }

  /// The hook's work for parameter `i` (public for the hook object; not for callers).
  void on_accumulated(size_t i);

 private:
  void start(size_t bucket);

  GradBuffer& grads_;
  runtime::ProcessGroups& groups_;
  bool reduce_scatter_;
  std::vector<size_t> bucket_of_;          // parameter → bucket
  std::vector<int> passes_;                // backward passes folded in this iteration, per parameter
  std::vector<size_t> waiting_;            // per bucket: parameters short of their last pass
  std::vector<BucketReduction> reductions_;  // per bucket
  std::vector<char> started_;              // per bucket: its collectives were issued
  std::vector<size_t> start_order_;        // buckets in the order they started
  int num_microbatches_ = 1;
  bool armed_ = false;
  bool finishing_ = false;
  int started_in_backward_ = 0;
};

}  // namespace loom::train::optim
