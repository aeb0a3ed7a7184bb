// The start of one rank of any Loom command (train, ptune, generate, eval, serve, plan
// calibrate), written once: who this rank is (the rendezvous), whether the world has the size
// the job asks for, this rank's share of the node's cores, its device, and its process groups
// (docs/architecture.md, "One rank session"). Commands parse their flags, then call their
// library's entry, which calls start_rank_session.
#pragma once
#include <chrono>
#include <memory>
#include <string>

#include "launch/env_rendezvous.h"
#include "runtime/process_groups.h"
#include "runtime/run_device.h"

namespace loom::runtime {

/// What a command asks of its ranks.
struct RankSessionRequest {
  /// The job's t, p and d (rules/layout.h; its other fields are not read): the world must be
  /// layout.world_size() = t·p·d ranks.
  Layout layout;
  /// The words that say where that number of ranks comes from, for the error when another
  /// number was started (e.g. "trainer.num_nodes × trainer.devices", "--tensor-parallel").
  std::string world_size_source = "the job";
  DeviceKind device = DeviceKind::kCpu;
  /// Bounds the rendezvous and every collective (ProcessGroupOptions::timeout).
  std::chrono::milliseconds timeout = kDefaultCollectiveTimeout;
};

/// A started rank: who it is and its groups (which own the device choice).
struct RankSession {
  launch::RendezvousInfo info;
  RunDevice device;
  std::shared_ptr<ProcessGroups> groups;
};

/// The world's size must equal request.layout.world_size() (std::invalid_argument naming both numbers
/// and request.world_size_source otherwise: bad input). Then: ATen's threads set to this
/// rank's fair share of the node's cores (cpu_threads.h); the device chosen and made current
/// (select_run_device: std::invalid_argument when the host lacks it); the process groups built
/// (collective: every rank calls this with the same request; std::runtime_error when the
/// rendezvous or a backend fails or times out).
RankSession start_rank_session(const launch::RendezvousInfo& info, const RankSessionRequest& request);

}  // namespace loom::runtime
