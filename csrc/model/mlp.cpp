#include "model/mlp.h"

#include <ATen/ATen.h>

#include <cmath>

#include "loom_ops/ops.h"
#include "model/init.h"

namespace loom::model {

namespace {
std::string prefix(int layer) { return "layers." + std::to_string(layer) + ".mlp."; }
}  // namespace

ParallelMlp::ParallelMlp(const GptConfig& c, int layer, runtime::CommunicatorPtr tp,
                         const at::TensorOptions& options)
    : fc1_(prefix(layer) + "linear_fc1",
           full_normal(c.seed, prefix(layer) + "linear_fc1.weight", {c.ffn(), c.hidden_size},
                       c.init_method_std),
           at::zeros({c.ffn()}),  // host: full initial values, sharded then moved (init.h)
           tp, c.layout.sequence_parallel, options),
      fc2_(prefix(layer) + "linear_fc2",
           full_normal(c.seed, prefix(layer) + "linear_fc2.weight", {c.hidden_size, c.ffn()},
                       c.init_method_std / std::sqrt(2.0 * c.num_layers)),
           at::zeros({c.hidden_size}),  // host: as above
           tp, c.layout.sequence_parallel, options) {}

std::pair<at::Tensor, at::Tensor> ParallelMlp::forward(const at::Tensor& x) const {
  at::Tensor h = fc1_.forward(x, /*skip_bias_add=*/true);  // [s, b, ffn/t]
  return fc2_.forward(ops::bias_gelu(h, fc1_.bias()));
}

void ParallelMlp::collect(ParamList& out) const {
  fc1_.collect(out);
  fc2_.collect(out);
}

}  // namespace loom::model
