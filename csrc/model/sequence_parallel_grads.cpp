#include "model/sequence_parallel_grads.h"

#include <ATen/ATen.h>

#include <map>

namespace loom::model {

void allreduce_sequence_parallel_grads(const ParamList& params, runtime::Communicator& tp) {
  if (tp.size() == 1) return;
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const auto& p : params) {
    if (!p.sequence_parallel) continue;
    const at::Tensor& g = p.tensor.grad();
    if (g.defined()) by_dtype[g.scalar_type()].push_back(g);
  }
  for (auto& [dtype, grads] : by_dtype) {
    std::vector<at::Tensor> flat;
    flat.reserve(grads.size());
    for (const auto& g : grads) flat.push_back(g.reshape({-1}));
    at::Tensor buffer = at::cat(flat);
    tp.all_reduce(buffer);
    int64_t offset = 0;
    for (auto& g : grads) {
      const int64_t n = g.numel();
      g.copy_(buffer.narrow(0, offset, n).view_as(g));
      offset += n;
    }
  }
}

}  // namespace loom::model
