#include "train/optim/grad_finalize.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

#include "runtime/coalesced.h"

namespace loom::train::optim {
namespace {

// SUM all-reduces, over `group`, the main grads of the selected parameters (one packed call).
template <typename Pred>
void all_reduce_selected(GradBuffer& grads, runtime::Communicator& group, Pred selected) {
  std::vector<at::Tensor> views;
  for (size_t i = 0; i < grads.params().size(); ++i)
    if (selected(grads.params()[i])) views.push_back(grads.main_grad(i).view(-1));
  runtime::all_reduce_coalesced(views, group);
}

}  // namespace

BucketReduction::BucketReduction(std::unique_ptr<runtime::AsyncWork> work, at::Tensor shard,
                                 at::Tensor destination)
    : work_(std::move(work)), shard_(std::move(shard)), destination_(std::move(destination)) {}

void BucketReduction::wait() {
  if (done_ || !work_) return;
  work_->wait();
  if (shard_.defined()) destination_.copy_(shard_);
  done_ = true;
}

BucketReduction start_bucket_reduction(GradBuffer& grads, size_t b, runtime::Communicator& data,
                                       bool reduce_scatter) {
  const int d = data.size();
  if (d == 1) return {};
  at::Tensor bucket = grads.bucket_view(b);
  bucket.mul_(1.0 / d);
  if (!reduce_scatter) return BucketReduction(data.all_reduce_async(bucket), {}, {});
  if (bucket.numel() % d != 0)
    throw std::invalid_argument("reduce-scatter of gradient bucket " + std::to_string(b) + ": " +
                                std::to_string(bucket.numel()) + " elements are not a multiple of the data-parallel size " +
                                std::to_string(d) + " (build the GradBuffer with pad_multiple = d)");
  const int64_t n = bucket.numel() / d;
  at::Tensor shard = at::empty({n}, bucket.options());
  auto work = data.reduce_scatter_dim0_async(bucket, shard);
  return BucketReduction(std::move(work), shard, bucket.narrow(0, data.rank() * n, n));
}

void reduce_data_parallel_grads(GradBuffer& grads, runtime::Communicator& data, bool reduce_scatter) {
  for (size_t b = 0; b < grads.buckets().size(); ++b) start_bucket_reduction(grads, b, data, reduce_scatter).wait();
}

void all_reduce_bucket_replicated_grads(GradBuffer& grads, size_t b, runtime::Communicator& tensor,
                                        runtime::Communicator& embedding) {
  const auto& in_bucket = grads.buckets().at(b).params;
  auto bucket_has = [&](const model::Param& p) {
    for (size_t i : in_bucket)
      if (&grads.params()[i] == &p) return true;
    return false;
  };
  all_reduce_selected(grads, tensor, [&](const model::Param& p) { return p.sequence_parallel && bucket_has(p); });
  all_reduce_selected(grads, embedding, [&](const model::Param& p) { return p.word_embedding && bucket_has(p); });
}

bool bucket_needs_embedding_reduction(const GradBuffer& grads, size_t b, const runtime::Communicator& embedding) {
  if (embedding.size() == 1) return false;
  for (size_t i : grads.buckets().at(b).params)
    if (grads.params()[i].word_embedding) return true;
  return false;
}

void all_reduce_sequence_parallel_grads(GradBuffer& grads, runtime::Communicator& tensor) {
  all_reduce_selected(grads, tensor, [](const model::Param& p) { return p.sequence_parallel; });
}

void all_reduce_word_embedding_grads(GradBuffer& grads, runtime::Communicator& embedding) {
  all_reduce_selected(grads, embedding, [](const model::Param& p) { return p.word_embedding; });
}

void finalize_grads(GradBuffer& grads, runtime::Communicator& data, runtime::Communicator& tensor,
                    runtime::Communicator& embedding, bool reduce_scatter) {
  if (reduce_scatter) {
    for (size_t b = 0; b < grads.buckets().size(); ++b) {
      all_reduce_bucket_replicated_grads(grads, b, tensor, embedding);
      start_bucket_reduction(grads, b, data, true).wait();
    }
    return;
  }
  reduce_data_parallel_grads(grads, data, false);
  all_reduce_sequence_parallel_grads(grads, tensor);
  all_reduce_word_embedding_grads(grads, embedding);
}

}  // namespace loom::train::optim
