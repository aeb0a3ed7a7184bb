#include "train/optim/distributed_optimizer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>

namespace loom::train::optim {

DistributedOptimizer::DistributedOptimizer(model::ParamList params,
                                           std::shared_ptr<runtime::ProcessGroups> groups,
                                           OptimizerOptions options)
    : Optimizer(std::move(params), std::move(groups), [&] {
        options.distributed = true;
        return options;
      }()) {
  for (const auto& p : params_) {
    if (p.tensor.scalar_type() != params_.front().tensor.scalar_type())
      throw std::invalid_argument("distributed optimizer: parameter '" + p.name + "' is " +
                                  std::string(c10::toString(p.tensor.scalar_type())) + " but '" +
                                  params_.front().name + "' is " +
                                  std::string(c10::toString(params_.front().tensor.scalar_type())) +
                                  "; all parameters must share one dtype");
  }
  const int64_t d = groups_->data().size(), r = groups_->data().rank();
  int64_t total = 0;
  for (const auto& bucket : grads_->buckets()) {
    shard_offsets_.push_back(total);
    total += bucket.numel / d;
  }
  auto opts = grads_->data().options();
  for (auto& s : shard_) s = at::zeros({total}, opts);

  for (size_t b = 0; b < grads_->buckets().size(); ++b) {
    const auto& bucket = grads_->buckets()[b];
    const int64_t n = bucket.numel / d;
    const int64_t lo_shard = bucket.offset + r * n, hi_shard = lo_shard + n;
    for (size_t i : bucket.params) {
      const int64_t lo_param = grads_->offset(i), hi_param = lo_param + params_[i].tensor.numel();
      const int64_t lo = std::max(lo_shard, lo_param), hi = std::min(hi_shard, hi_param);
      if (lo >= hi) continue;
      Piece piece;
      piece.param = i;
      piece.param_offset = lo - lo_param;
      piece.numel = hi - lo;
      const int64_t at_shard = shard_offsets_[b] + (lo - lo_shard);
      piece.main = shard_[0].narrow(0, at_shard, piece.numel);
      piece.exp_avg = shard_[1].narrow(0, at_shard, piece.numel);
      piece.exp_avg_sq = shard_[2].narrow(0, at_shard, piece.numel);
      piece.grad = grads_->data().narrow(0, lo, piece.numel);
      pieces_.push_back(std::move(piece));
    }
  }
  bucket_of_.assign(params_.size(), 0);
  for (size_t b = 0; b < grads_->buckets().size(); ++b)
    for (size_t i : grads_->buckets()[b].params) bucket_of_[i] = b;
  issue_index_.assign(grads_->buckets().size(), 0);
  init_main_from_params();
}

at::Tensor DistributedOptimizer::bucket_shard(int kind, size_t b) const {
  const int64_t n = grads_->buckets()[b].numel / groups_->data().size();
  return shard_[kind].narrow(0, shard_offsets_[b], n);
}

void DistributedOptimizer::publish_params(bool async) {
  at::NoGradGuard no_grad;
  finish_publish();  // never two rounds in flight
  if (params_.empty()) return;
  const auto dtype = params_.front().tensor.scalar_type();
  // The forward's order: the last bucket holds the first parameters (grad_buffer.h).
  for (size_t b = grads_->buckets().size(); b-- > 0;) {
    issue_index_[b] = gathers_.size();
    PendingGather g;
    g.bucket = b;
    g.shard = bucket_shard(0, b).to(dtype);
    g.full = at::empty({g.shard.numel() * groups_->data().size()}, g.shard.options());
    g.work = groups_->data().all_gather_dim0_async(g.shard, g.full);
    gathers_.push_back(std::move(g));
  }
  if (!async) finish_publish();
}

void DistributedOptimizer::finish_publish() { complete_gathers(gathers_.size()); }

void DistributedOptimizer::finish_publish_of(size_t first, size_t end) {
  if (completed_ == gathers_.size()) return;
  size_t until = completed_;
  for (size_t i = first; i < end; ++i) until = std::max(until, issue_index_[bucket_of_[i]] + 1);
  complete_gathers(until);
}

void DistributedOptimizer::complete_gathers(size_t until) {
  at::NoGradGuard no_grad;
  for (; completed_ < until; ++completed_) {
    PendingGather& g = gathers_[completed_];
    g.work->wait();
    const auto& bucket = grads_->buckets()[g.bucket];
    for (size_t i : bucket.params) {
      at::Tensor p = params_[i].tensor.detach();
      p.copy_(g.full.narrow(0, grads_->offset(i) - bucket.offset, p.numel()).view(p.sizes()));
    }
    g = PendingGather{};  // frees the gathered bucket now, not at the end of the round
  }
  if (completed_ == gathers_.size()) {
    gathers_.clear();
    completed_ = 0;
  }
}

std::vector<at::Tensor> DistributedOptimizer::gather_state(int kind) {
  std::vector<at::Tensor> out(params_.size());
  for (size_t b = 0; b < grads_->buckets().size(); ++b) {
    const auto& bucket = grads_->buckets()[b];
    at::Tensor full = groups_->data().all_gather_dim0(bucket_shard(kind, b));
    for (size_t i : bucket.params) {
      const auto& p = params_[i].tensor;
      out[i] = full.narrow(0, grads_->offset(i) - bucket.offset, p.numel()).view(p.sizes()).clone();
    }
  }
  return out;
}

}  // namespace loom::train::optim
