// The plain optimizer (model.optim.name: fused_adam): every data-parallel rank all-reduces the
// whole gradient and updates the whole model. fp32 models are updated in place (the parameters
// are the main parameters); bf16/fp16 models keep fp32 main copies that are rounded into the
// parameters after each update. See optimizer.h.
#pragma once
#include "train/optim/optimizer.h"

namespace loom::train::optim {

class PlainOptimizer : public Optimizer {
 public:
  PlainOptimizer(model::ParamList params, std::shared_ptr<runtime::ProcessGroups> groups,
                 OptimizerOptions options);

 protected:
  void publish_params(bool async = false) override;
  std::vector<at::Tensor> gather_state(int kind) override;
};

}  // namespace loom::train::optim
