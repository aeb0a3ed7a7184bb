// Small control messages between the ranks of a serving job: a JSON value sent from one rank
// to every rank of a host (CPU) group as CBOR bytes (RFC 8949; nlohmann::json's encoder): its
// length, then its bytes, two broadcasts bounded by the group's timeout.
#pragma once
#include <nlohmann/json.hpp>

#include "runtime/communicator.h"

namespace loom::serve {

/// Collective over `group`: every member ends with group rank `root`'s `value`. Throws what
/// the group's broadcast throws (a dead member, the timeout).
void broadcast_json(runtime::Communicator& group, nlohmann::json& value, int root);

}  // namespace loom::serve
