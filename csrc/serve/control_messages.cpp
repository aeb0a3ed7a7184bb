#include "serve/control_messages.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

namespace loom::serve {

void broadcast_json(runtime::Communicator& group, nlohmann::json& value, int root) {
  if (group.size() == 1) return;
  std::vector<uint8_t> bytes;
  if (group.rank() == root) bytes = nlohmann::json::to_cbor(value);
  const auto options = at::TensorOptions().device(group.device());
  at::Tensor size = at::full({1}, static_cast<int64_t>(bytes.size()), options.dtype(at::kLong));
  group.broadcast(size, root);
  const int64_t n = size.item<int64_t>();
  at::Tensor data = at::empty({std::max<int64_t>(n, 1)}, options.dtype(at::kByte));
  if (group.rank() == root && n > 0) std::memcpy(data.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  group.broadcast(data, root);
  if (group.rank() != root) {
    const uint8_t* p = data.data_ptr<uint8_t>();
    value = nlohmann::json::from_cbor(p, p + n);
  }
}

}  // namespace loom::serve
