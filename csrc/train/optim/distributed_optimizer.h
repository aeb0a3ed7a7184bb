// The distributed optimizer (ZeRO-1, model.optim.name: distributed_fused_adam;
// docs/design/parallel_layout.md, "Distributed optimizer"). The fp32 gradient buffer's buckets are padded to
// a multiple of the data-parallel size d; data rank r owns elements [r·n/d, (r+1)·n/d) of each
// bucket of n elements: it keeps fp32 main parameters and both Adam moments for those elements
// only (12/d bytes per parameter instead of 12), receives their gradients by reduce-scatter,
// updates them, and all-gathers the updated shards, cast to the model dtype, into the model
// parameters. See optimizer.h.
//
// With overlap_param_gather the all-gathers are issued in the order the next forward reads the
// parameters: the buckets hold them in backprop order (grad_buffer.h), so the last bucket (the
// first layers' parameters) goes first. Every data-parallel rank has the same buckets and so
// issues the same sequence (fixed at step()). wait_for_params_of() completes them in that order
// up to the last one the parameters need (Megatron-Core's per-bucket forward pre-hook wait).
#pragma once
#include "train/optim/optimizer.h"

namespace loom::train::optim {

class DistributedOptimizer : public Optimizer {
 public:
  /// Throws std::invalid_argument when the parameters do not share one dtype.
  DistributedOptimizer(model::ParamList params, std::shared_ptr<runtime::ProcessGroups> groups,
                       OptimizerOptions options);

  /// Elements of optimizer state this rank holds (per kind), padding included.
  int64_t shard_numel() const { return shard_[0].numel(); }
  int param_gathers_pending() const override { return static_cast<int>(gathers_.size() - completed_); }

 protected:
  void publish_params(bool async = false) override;
  void finish_publish() override;
  void finish_publish_of(size_t first, size_t end) override;
  std::vector<at::Tensor> gather_state(int kind) override;

 private:
  at::Tensor bucket_shard(int kind, size_t bucket) const;
  at::Tensor shard_[3];                 ///< main, exp_avg, exp_avg_sq: fp32, buckets' shards concatenated
  std::vector<int64_t> shard_offsets_;  ///< where each bucket's shard starts in shard_[k]
  struct PendingGather {
    std::unique_ptr<runtime::AsyncWork> work;
    at::Tensor shard, full;  ///< the model-dtype shard sent and the gathered bucket
    size_t bucket = 0;
  };
  /// Waits for gathers_[completed_, until) in order and copies them into the parameters.
  void complete_gathers(size_t until);
  std::vector<PendingGather> gathers_;  ///< publish_params(true)'s all-gathers, in issue order
  size_t completed_ = 0;                ///< gathers_[0, completed_) are done and copied
  std::vector<size_t> bucket_of_;       ///< parameter → bucket
  std::vector<size_t> issue_index_;     ///< bucket → its index in gathers_
};

}  // namespace loom::train::optim
