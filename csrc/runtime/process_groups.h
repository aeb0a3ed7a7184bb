// All of a rank's process groups, built over one c10d store (PrefixStore per group), one
// backend per group: Gloo for CPU tensors, NCCL for CUDA tensors (docs/design/parallel_layout.md,
// "Process groups"; docs/design/conventions.md: there is no C++ new_group, so each group is its own backend).
#pragma once
#include <chrono>
#include <memory>
#include <string>

#include "launch/env_rendezvous.h"
#include "runtime/communicator.h"
#include "runtime/parallel_layout.h"
#include "runtime/pipeline_links.h"
#include "runtime/run_device.h"

namespace loom::runtime {

/// How long the rendezvous and a collective may take when the caller names no bound (a
/// recipe's model.collective_timeout_s does; tests and tools rely on this one).
inline constexpr std::chrono::milliseconds kDefaultCollectiveTimeout = std::chrono::seconds(300);

struct ProcessGroupOptions {
  /// The groups' t and p (rules/layout.h); d is the world's size / (t·p), so layout.dp and
  /// the layout's other fields are not read.
  Layout layout;
  /// Where the groups' tensors live and which backend moves them (select_run_device()).
  RunDevice device;
  /// Bounds every collective and the rendezvous; a dead or stuck peer makes the call throw.
  std::chrono::milliseconds timeout = kDefaultCollectiveTimeout;
  /// Real backends even for a world of one and for one-member groups (also set by the
  /// environment variable LOOM_SINGLE_RANK_GROUPS=1): a single-GPU run then goes through NCCL
  /// exactly as a multi-GPU run does (the GPU bring-up's NCCL check). Off: one rank needs no
  /// c10d at all.
  bool single_rank_backends = false;
};

/// The groups of docs/design/parallel_layout.md for this rank. Every rank of the world must build it with
/// the same options (building a group is collective).
class ProcessGroups {
 public:
  /// Connects to the rendezvous store of `info` (hosting it on rank 0 unless the torchrun agent
  /// does) and builds every group. Throws std::invalid_argument for sizes that do not divide,
  /// std::runtime_error when the rendezvous or a backend fails.
  static std::shared_ptr<ProcessGroups> create(const launch::RendezvousInfo& info,
                                               const ProcessGroupOptions& options);
  /// Size-1 groups for a single process with t = p = 1 (no store, no c10d) on `device`.
  static std::shared_ptr<ProcessGroups> single_process(c10::Device device = c10::kCPU);

  ~ProcessGroups();

  const ParallelLayout& layout() const { return layout_; }
  int rank() const { return rank_; }
  RankCoords coords() const { return layout_.coords(rank_); }
  /// The device every group's tensors live on.
  c10::Device device() const { return device_; }

  Communicator& world() { return *world_; }
  Communicator& tensor() { return *tensor_; }
  Communicator& data() { return *data_; }
  Communicator& pipeline() { return *pipeline_; }
  /// Point-to-point links of this rank's stage to its neighbours, one communicator per
  /// direction (pipeline_links.h). Only these carry pipeline activations and gradients.
  PipelineLinks& pipeline_links() { return *links_; }
  Communicator& model_parallel() { return *model_parallel_; }
  /// First and last pipeline stage of this rank's pipeline (tied word embeddings).
  /// Only meaningful on those stages (size 1 elsewhere, and when p = 1).
  Communicator& embedding() { return *embedding_; }
  /// Every rank, for host (CPU) tensors: control messages and barriers. The same group as
  /// world() on CPU ranks.
  Communicator& host_world() { return *host_world_; }

  CommunicatorPtr world_ptr() const { return world_; }
  CommunicatorPtr tensor_ptr() const { return tensor_; }
  CommunicatorPtr data_ptr() const { return data_; }
  CommunicatorPtr pipeline_ptr() const { return pipeline_; }
  CommunicatorPtr model_parallel_ptr() const { return model_parallel_; }
  CommunicatorPtr embedding_ptr() const { return embedding_; }

  /// Shuts every group down (waits for pending work). Also done by the destructor.
  void shutdown();

 private:
  ProcessGroups(ParallelLayout layout, int rank, c10::Device device);
  ParallelLayout layout_;
  int rank_;
  c10::Device device_;
  CommunicatorPtr world_, tensor_, data_, pipeline_, model_parallel_, embedding_, host_world_;
  std::unique_ptr<PipelineLinks> links_;
  struct StoreHolder;
  std::shared_ptr<StoreHolder> store_;
};

}  // namespace loom::runtime
