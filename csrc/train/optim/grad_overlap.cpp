#include "train/optim/grad_overlap.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace loom::train::optim {
namespace {

// Calls back into the reduction after autograd accumulated parameter `index`'s gradient.
class AccumulatedHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  AccumulatedHook(OverlappedGradReduction& owner, size_t index) : owner_(owner), index_(index) {}
  void operator()(const torch::autograd::Variable& /*tensor*/) override { owner_.on_accumulated(index_); }

 private:
  OverlappedGradReduction& owner_;
  size_t index_;
};

}  // namespace

OverlappedGradReduction::OverlappedGradReduction(GradBuffer& grads, runtime::ProcessGroups& groups,
                                                 bool reduce_scatter)
    : grads_(grads), groups_(groups), reduce_scatter_(reduce_scatter) {
  const auto& params = grads_.params();
  bucket_of_.assign(params.size(), 0);
  for (size_t b = 0; b < grads_.buckets().size(); ++b)
    for (size_t i : grads_.buckets()[b].params) bucket_of_[i] = b;
  passes_.assign(params.size(), 0);
  for (size_t i = 0; i < params.size(); ++i)
    torch::autograd::impl::set_post_acc_grad_hooks(params[i].tensor, std::make_unique<AccumulatedHook>(*this, i));
}

OverlappedGradReduction::~OverlappedGradReduction() {
  for (const auto& p : grads_.params()) torch::autograd::impl::set_post_acc_grad_hooks(p.tensor, nullptr);
}

void OverlappedGradReduction::begin(int num_microbatches) {
  if (num_microbatches < 1)
    throw std::invalid_argument("overlapped gradient reduction: num_microbatches must be >= 1, got " +
                                std::to_string(num_microbatches));
  num_microbatches_ = num_microbatches;
  std::fill(passes_.begin(), passes_.end(), 0);
  waiting_.clear();
  for (const auto& bucket : grads_.buckets()) waiting_.push_back(bucket.params.size());
  reductions_.clear();
  reductions_.resize(grads_.buckets().size());
  started_.assign(grads_.buckets().size(), 0);
  start_order_.clear();
  started_in_backward_ = 0;
  armed_ = true;
}

void OverlappedGradReduction::on_accumulated(size_t i) {
  if (!armed_) return;  // outside an iteration: the loop's accumulate() folds .grad as before
  const auto& param = grads_.params()[i];
  at::Tensor& grad = param.tensor.mutable_grad();
  if (!grad.defined()) return;
  const size_t b = bucket_of_[i];
  if (started_[b])
    throw std::logic_error("overlapped gradient reduction: parameter '" + param.name +
                           "' got a gradient after its bucket's reduction started (more backward passes than the " +
                           std::to_string(num_microbatches_) + " micro-batches announced)");
  {
    at::NoGradGuard no_grad;
    grads_.main_grad(i).add_(grad);  // as GradBuffer::accumulate: fp32 += bf16/fp16 in fp32
  }
  grad.reset();
  if (++passes_[i] == num_microbatches_ && --waiting_[b] == 0) {
    // The embedding group's all-reduce meets the other end stage: left to finish().
    if (reduce_scatter_ && bucket_needs_embedding_reduction(grads_, b, groups_.embedding())) return;
    start(b);
    ++started_in_backward_;
  }
}

void OverlappedGradReduction::start(size_t b) {
  at::NoGradGuard no_grad;
  if (reduce_scatter_) all_reduce_bucket_replicated_grads(grads_, b, groups_.tensor(), groups_.embedding());
  reductions_[b] = start_bucket_reduction(grads_, b, groups_.data(), reduce_scatter_);
  started_[b] = 1;
  start_order_.push_back(b);
}

void OverlappedGradReduction::finish() {
  if (!armed_) throw std::logic_error("overlapped gradient reduction: finish() without begin()");
  armed_ = false;
  at::NoGradGuard no_grad;
  // Gradients the hooks did not see (none in a GPT step; kept for safety) are folded in first.
  grads_.accumulate();
  for (size_t b = 0; b < reductions_.size(); ++b)
    if (!started_[b]) start(b);
  for (size_t b : start_order_) reductions_[b].wait();
  if (!reduce_scatter_) {
    all_reduce_sequence_parallel_grads(grads_, groups_.tensor());
    all_reduce_word_embedding_grads(grads_, groups_.embedding());
  }
}

}  // namespace loom::train::optim
