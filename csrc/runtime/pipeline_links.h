// The point-to-point links of a pipeline stage to its neighbours: stage r sends activations to
// r+1 and gradients to r-1 (wrapping around between the last and the first stage for the
// interleaved schedule). Each *direction* between two stages has a communicator of its own.
//
// Why: NCCL runs the operations of one communicator in order on one stream, and a send waits
// for the matching receive. On one shared communicator, 1F1B's steady state queues "send the
// activation to r+1, then receive the gradient from r+1" on stage r while stage r+1 queues
// "send the gradient to r, then receive the activation from r": both streams sit in a send
// and the pipeline deadlocks (Megatron avoids it by batching such pairs, batch_isend_irecv).
// With one communicator per direction, a stream only ever sends or only ever receives, in the
// order the schedule issues them, so no order of operations can deadlock
// (docs/design/devices.md, "Pipeline traffic").
#pragma once
#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <utility>

#include "runtime/communicator.h"

namespace loom::runtime {

class PipelineLinks {
 public:
  /// `stage` of `size` stages; `links` maps (from stage, to stage) to the two-member
  /// communicator of that direction, for every direction this stage sends or receives on.
  PipelineLinks(int stage, int size, std::map<std::pair<int, int>, CommunicatorPtr> links);
  /// A single stage: no links.
  static PipelineLinks single();

  int size() const { return size_; }
  int rank() const { return stage_; }  ///< this stage

  /// Non-blocking send of `t` (contiguous, on the links' device) to stage `to`; messages to one
  /// stage arrive in the order sent. The work keeps the tensor alive until it completed.
  std::unique_ptr<AsyncWork> isend(const at::Tensor& t, int to);
  /// Receives into `t` from stage `from` (the next message on that direction).
  void recv(at::Tensor& t, int from);

 private:
  Communicator& link(int from, int to);
  int stage_ = 0, size_ = 1;
  std::map<std::pair<int, int>, CommunicatorPtr> links_;
};

}  // namespace loom::runtime
