#include "model/sequence_parallel_grads.h"

#include "runtime/coalesced.h"

namespace loom::model {

void allreduce_sequence_parallel_grads(const ParamList& params, runtime::Communicator& tp) {
  std::vector<at::Tensor> grads;
  for (const auto& p : params)
    if (p.sequence_parallel) grads.push_back(p.tensor.grad());
  runtime::all_reduce_coalesced(grads, tp);
}

}  // namespace loom::model
