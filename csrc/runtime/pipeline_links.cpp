#include "runtime/pipeline_links.h"

#include <stdexcept>
#include <string>

namespace loom::runtime {

PipelineLinks::PipelineLinks(int stage, int size, std::map<std::pair<int, int>, CommunicatorPtr> links)
    : stage_(stage), size_(size), links_(std::move(links)) {}

PipelineLinks PipelineLinks::single() { return PipelineLinks(0, 1, {}); }

Communicator& PipelineLinks::link(int from, int to) {
  auto it = links_.find({from, to});
  if (it == links_.end())
    throw std::logic_error("pipeline stage " + std::to_string(stage_) + " has no link from stage " +
                           std::to_string(from) + " to stage " + std::to_string(to));
  return *it->second;
}

std::unique_ptr<AsyncWork> PipelineLinks::isend(const at::Tensor& t, int to) {
  Communicator& c = link(stage_, to);
  return c.isend(t, 1 - c.rank());  // the link's other member
}

void PipelineLinks::recv(at::Tensor& t, int from) {
  Communicator& c = link(from, stage_);
  c.recv(t, 1 - c.rank());
}

}  // namespace loom::runtime
