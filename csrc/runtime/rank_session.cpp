#include "runtime/rank_session.h"

#include <fmt/format.h>

#include <stdexcept>

#include "runtime/cpu_threads.h"

namespace loom::runtime {

RankSession start_rank_session(const launch::RendezvousInfo& info, const RankSessionRequest& request) {
  if (info.world_size != request.layout.world_size())
    throw std::invalid_argument(fmt::format("{} asks for {} ranks, but {} were started", request.world_size_source,
                                            request.layout.world_size(), info.world_size));
  use_fair_share_of_cores(info.local_world_size);
  ProcessGroupOptions options;
  options.layout = request.layout;
  options.timeout = request.timeout;
  options.device = select_run_device(request.device, info.local_rank);
  RankSession session{info, options.device, nullptr};
  session.groups = ProcessGroups::create(info, options);
  return session;
}

}  // namespace loom::runtime
