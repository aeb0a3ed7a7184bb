#include "runtime/coalesced.h"

#include <ATen/ATen.h>

#include <map>

namespace loom::runtime {

void all_reduce_coalesced(const std::vector<at::Tensor>& tensors, Communicator& group) {
  if (group.size() == 1) return;
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const auto& t : tensors)
    if (t.defined()) by_dtype[t.scalar_type()].push_back(t);
  for (auto& [dtype, list] : by_dtype) {
    std::vector<at::Tensor> flat;
    flat.reserve(list.size());
    for (const auto& t : list) flat.push_back(t.reshape({-1}));
    at::Tensor packed = at::cat(flat);
    group.all_reduce(packed);
    int64_t offset = 0;
    for (auto& t : list) {
      const int64_t n = t.numel();
      t.copy_(packed.narrow(0, offset, n).view_as(t));
      offset += n;
    }
  }
}

}  // namespace loom::runtime
