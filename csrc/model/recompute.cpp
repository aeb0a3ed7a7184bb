#include "model/recompute.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "model/capsule.h"

namespace loom::model {

namespace {

struct CheckpointFunction : Function<CheckpointFunction> {
  // apply() runs forward with grad mode off: nothing inside the chunk is kept.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input,
                            const ChunkForward& chunk) {
    ctx->saved_data["chunk"] = detail::make_capsule(chunk);
    ctx->save_for_backward({input});
    return chunk(input);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor input = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    const auto& chunk = detail::from_capsule<ChunkForward>(ctx->saved_data["chunk"]);
    at::Tensor output;
    {
      at::AutoGradMode enable_grad(true);
      output = chunk(input);
    }
    torch::autograd::backward({output}, {grads[0]});
    return {input.grad(), at::Tensor()};
  }
};

}  // namespace

at::Tensor checkpoint(const ChunkForward& chunk, const at::Tensor& input) {
  // The output must be part of the graph even when the input is not (the parameters inside
  // the chunk are not inputs of the function): give it a leaf that requires grad.
  if (!input.requires_grad()) return CheckpointFunction::apply(input.detach().requires_grad_(true), chunk);
  return CheckpointFunction::apply(input, chunk);
}

}  // namespace loom::model
