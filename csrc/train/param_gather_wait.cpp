#include "train/param_gather_wait.h"

#include <stdexcept>
#include <string>

namespace loom::train {

void wait_for_params_in_forward(std::vector<model::GptStage>& chunks, optim::Optimizer& optimizer) {
  const model::ParamList& all = optimizer.params();
  size_t offset = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const model::ParamList own = chunks[c].parameters();
    for (size_t i = 0; i < own.size(); ++i) {
      if (offset + i >= all.size() || !all[offset + i].tensor.is_same(own[i].tensor))
        throw std::invalid_argument("wait_for_params_in_forward: chunk " + std::to_string(c) + "'s parameter '" +
                                    own[i].name + "' is not the optimizer's parameter " +
                                    std::to_string(offset + i) + " (expected chunk_parameters(chunks))");
    }
    chunks[c].set_param_read_hook([&optimizer, offset](size_t first, size_t end) {
      optimizer.wait_for_params_of(offset + first, offset + end);
    });
    offset += own.size();
  }
  if (offset != all.size())
    throw std::invalid_argument("wait_for_params_in_forward: the chunks hold " + std::to_string(offset) +
                                " parameters, the optimizer " + std::to_string(all.size()));
  optimizer.set_forward_waits_for_params(true);
}

}  // namespace loom::train
