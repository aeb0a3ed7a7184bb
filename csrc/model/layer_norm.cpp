#include "model/layer_norm.h"

#include <ATen/ATen.h>

#include "loom_ops/ops.h"
#include "model/init.h"
#include "model/rms_norm.h"

namespace loom::model {

LayerNorm::LayerNorm(std::string name, int64_t hidden, double eps, bool sequence_parallel,
                     const at::TensorOptions& options, Normalization kind, bool bias, bool fused)
    : name_(std::move(name)), eps_(eps), sequence_parallel_(sequence_parallel), kind_(kind), fused_(fused) {
  weight_ = make_parameter(at::ones({hidden}, options), options);
  if (bias && kind == Normalization::kLayerNorm) bias_ = make_parameter(at::zeros({hidden}, options), options);
}

at::Tensor LayerNorm::forward(const at::Tensor& x) const {
  if (kind_ == Normalization::kRmsNorm) return fused_ ? ops::rms_norm(x, weight_, eps_) : rms_norm(x, weight_, eps_);
  if (!bias_.defined() || !fused_) {
    const int64_t hidden = x.size(-1);
    return at::layer_norm(x, {hidden}, weight_, bias_.defined() ? std::optional<at::Tensor>(bias_) : std::nullopt,
                          eps_);
  }
  return ops::layer_norm(x, weight_, bias_, eps_);
}

void LayerNorm::collect(ParamList& out) const {
  Param w{name_ + ".weight", weight_, -1};
  w.sequence_parallel = sequence_parallel_;
  w.weight_decay = false;
  out.push_back(w);
  if (!bias_.defined()) return;
  Param b{name_ + ".bias", bias_, -1};
  b.sequence_parallel = sequence_parallel_;
  b.weight_decay = false;
  out.push_back(b);
}

}  // namespace loom::model
