// The distributed optimizer (ZeRO-1, model.optim.name: distributed_fused_adam;
// docs/design/parallel_layout.md, "Distributed optimizer"). The fp32 gradient buffer's buckets are padded to
// a multiple of the data-parallel size d; data rank r owns elements [r·n/d, (r+1)·n/d) of each
// bucket of n elements: it keeps fp32 main parameters and both Adam moments for those elements
// only (12/d bytes per parameter instead of 12), receives their gradients by reduce-scatter,
// updates them, and all-gathers the updated shards, cast to the model dtype, into the model
// parameters. See optimizer.h.
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

 protected:
  void publish_params(bool async = false) override;
  void finish_publish() override;
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
  std::vector<PendingGather> gathers_;  ///< publish_params(true)'s all-gathers in flight
};

}  // namespace loom::train::optim
