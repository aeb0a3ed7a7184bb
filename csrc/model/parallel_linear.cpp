#include "model/parallel_linear.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "model/capsule.h"
#include "model/init.h"
#include "model/lora.h"
#include "model/lora_serving.h"
#include "model/mappings.h"

namespace loom::model {

namespace {

struct LinearWithGather : Function<LinearWithGather> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const std::optional<at::Tensor>& b,
                            const runtime::CommunicatorPtr& tp) {
    ctx->saved_data["tp"] = detail::make_capsule(tp);
    ctx->saved_data["has_bias"] = b.has_value() && b->defined();
    ctx->save_for_backward({x, w});  // the local shard only, never the gathered input
    at::Tensor total = comm::all_gather_dim0(x, *tp);
    return at::linear(total, w, b.has_value() ? *b : at::Tensor());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    auto& tp = *detail::from_capsule<runtime::CommunicatorPtr>(ctx->saved_data["tp"]);
    at::Tensor g = grads[0].contiguous();
    at::Tensor total = comm::all_gather_dim0(x, tp);  // gathered again, not stored
    at::Tensor g2 = g.reshape({-1, g.size(-1)});
    at::Tensor dw = g2.t().mm(total.reshape({-1, total.size(-1)}));
    at::Tensor db = ctx->saved_data["has_bias"].toBool() ? g2.sum(0) : at::Tensor();
    at::Tensor dtotal = g.matmul(w);
    at::Tensor dx = comm::reduce_scatter_dim0(dtotal, tp);
    return {dx, dw, db, at::Tensor()};
  }
};

}  // namespace

at::Tensor linear_with_sequence_parallel_gather(const at::Tensor& x, const at::Tensor& weight,
                                                const std::optional<at::Tensor>& bias,
                                                const runtime::CommunicatorPtr& tp) {
  return LinearWithGather::apply(x, weight, bias, tp);
}

ColumnParallelLinear::ColumnParallelLinear(std::string name, const at::Tensor& full_weight,
                                           const std::optional<at::Tensor>& full_bias,
                                           runtime::CommunicatorPtr tp, bool sequence_parallel,
                                           const at::TensorOptions& options)
    : ParallelLinearState(std::move(name), std::move(tp), sequence_parallel) {
  weight_ = make_parameter(shard(full_weight, 0, tp_->rank(), tp_->size()), options);
  if (full_bias && full_bias->defined())
    bias_ = make_parameter(shard(*full_bias, 0, tp_->rank(), tp_->size()), options);
}

namespace detail {
void ParallelLinearState::attach_lora_adapter(bool column, LoraTarget target, int layer, const LoraConfig& config,
                                              uint64_t seed, const at::TensorOptions& options) {
  if (!config.adapts(target)) return;
  const int64_t t = tp_->size();
  const int64_t out = column ? weight_.size(0) * t : weight_.size(0);
  const int64_t in = column ? weight_.size(1) : weight_.size(1) * t;
  lora_ = std::make_shared<const LoraAdapter>(name_, column ? LoraBase::kColumnParallel : LoraBase::kRowParallel,
                                              target, layer, in, out, config, seed, tp_, sequence_parallel_, options);
}
}  // namespace detail

at::Tensor ColumnParallelLinear::forward(const at::Tensor& x, bool skip_bias_add, const DropoutContext* dropout,
                                         const LoraBatch* served) const {
  std::optional<at::Tensor> b;
  if (bias_.defined() && !skip_bias_add) b = bias_;
  at::Tensor y;
  if (sequence_parallel_) {
    y = linear_with_sequence_parallel_gather(x, weight_, b, tp_);
  } else {
    at::Tensor input = copy_to_tensor_model_parallel_region(x, tp_);
    y = at::linear(input, weight_, b.has_value() ? *b : at::Tensor());
  }
  if (lora_) y = y + lora_->column_update(x, dropout);
  if (served != nullptr && served->active()) y = served->add_column_updates(name_, x, y);
  return y;
}

void ColumnParallelLinear::collect(ParamList& out) const {
  out.push_back({name_ + ".weight", weight_, 0});
  if (bias_.defined()) {
    Param b{name_ + ".bias", bias_, 0};
    b.weight_decay = false;
    out.push_back(b);
  }
  if (lora_) lora_->collect(out);
}

RowParallelLinear::RowParallelLinear(std::string name, const at::Tensor& full_weight,
                                     const at::Tensor& full_bias, runtime::CommunicatorPtr tp,
                                     bool sequence_parallel, const at::TensorOptions& options)
    : ParallelLinearState(std::move(name), std::move(tp), sequence_parallel) {
  weight_ = make_parameter(shard(full_weight, 1, tp_->rank(), tp_->size()), options);
  if (full_bias.defined()) bias_ = make_parameter(full_bias, options);
}

std::pair<at::Tensor, at::Tensor> RowParallelLinear::forward(const at::Tensor& x, const DropoutContext* dropout,
                                                             const LoraBatch* served) const {
  at::Tensor partial = at::linear(x, weight_);
  if (lora_) partial = partial + lora_->row_partial_update(x, dropout);  // reduced with the base's
  if (served != nullptr && served->active()) partial = served->add_row_partial_updates(name_, x, partial);
  at::Tensor out = sequence_parallel_ ? reduce_scatter_to_sequence_parallel_region(partial, tp_)
                                      : reduce_from_tensor_model_parallel_region(partial, tp_);
  return {out, bias_};
}

void RowParallelLinear::collect(ParamList& out) const {
  out.push_back({name_ + ".weight", weight_, 1});
  if (bias_.defined()) {
    Param b{name_ + ".bias", bias_, -1};
    b.sequence_parallel = sequence_parallel_;
    b.weight_decay = false;
    out.push_back(b);
  }
  if (lora_) lora_->collect(out);
}

}  // namespace loom::model
