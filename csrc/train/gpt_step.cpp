#include "train/gpt_step.h"

#include <ATen/ATen.h>

#include <stdexcept>

namespace loom::train {

namespace {

at::Tensor device_zeros(int64_t n, at::Device device) {
  return at::zeros({n}, at::TensorOptions().dtype(at::kDouble).device(device));
}

}  // namespace

ScheduleConfig gpt_schedule(const model::GptConfig& config, const Layout& layout,
                            at::Device device, bool forward_only) {
  ScheduleConfig sc;
  sc.num_microbatches = static_cast<int>(layout.micro_batches());
  sc.virtual_stages = layout.vp;
  sc.forward_only = forward_only;
  const bool sp = config.layout.sequence_parallel;  // normalised by the recipe loader (off at t = 1)
  sc.activation_shape = {sp ? config.seq_length / layout.tp : config.seq_length, layout.micro_batch,
                         config.hidden_size};
  sc.activation_dtype = model::scalar_type(config.params_dtype);
  sc.activation_device = device;
  return sc;
}

GptStep::GptStep(const std::vector<model::GptStage>& chunks, runtime::ProcessGroups& groups,
                 const Layout& layout)
    : chunks_(chunks),
      groups_(groups),
      layout_(layout),
      last_stage_(groups.coords().pp == layout.pp - 1) {
  if (chunks_.empty()) throw std::invalid_argument("GptStep: this rank holds no model chunk");
  const auto& config = chunks_.front().config();
  train_schedule_ = gpt_schedule(config, layout_, groups_.device(), false);
  eval_schedule_ = gpt_schedule(config, layout_, groups_.device(), true);
}

at::Tensor GptStep::forward(int chunk, const MicroBatch& mb, const at::Tensor& input,
                            const model::DropoutContext& dropout, bool evaluation) {
  const auto& stage = chunks_[chunk];
  model::StageInputs in;
  // Every stage: later ones rotate by the positions (RoPE) and mask by the examples of packed rows.
  in.position_ids = mb.position_ids;
  in.segment_ids = mb.segment_ids;
  if (stage.layout().pre_process) {
    in.tokens = mb.tokens;
    in.prompt = mb.prompt;
  } else {
    in.hidden = input;
  }
  if (stage.layout().post_process) in.labels = mb.labels;
  at::Tensor out = stage.forward(in, dropout);
  if (!stage.layout().post_process) return out;
  at::Tensor masked = (out.to(at::kFloat) * mb.loss_mask).sum();
  if (evaluation) return at::stack({masked, mb.loss_mask.sum()});
  at::Tensor loss = masked * token_scale_;
  if (loss_scale_.defined()) loss = loss * loss_scale_;
  return loss;
}

at::Tensor GptStep::train(const std::vector<MicroBatch>& batches,
                          const model::DropoutContext& dropout, const at::Tensor& loss_scale,
                          const std::function<void()>& after_backward) {
  if (static_cast<int64_t>(batches.size()) != layout_.micro_batches())
    throw std::logic_error("GptStep::train: expected one micro-batch per schedule slot");
  const at::Device device = groups_.device();
  if (last_stage_) {
    at::Tensor tokens = device_zeros(1, device);
    for (const auto& mb : batches) tokens += mb.loss_mask.sum().to(at::kDouble);
    groups_.data().all_reduce(tokens);
    // d / tokens rounded once to float32, as a host scalar would be.
    token_scale_ = (double(layout_.dp) / tokens.clamp_min(1.0)).to(at::kFloat).squeeze();
  }
  // Rounded to fp32 once, as a host scalar would be when it multiplies the fp32 loss.
  loss_scale_ = loss_scale.defined() ? loss_scale.to(at::kFloat) : at::Tensor();
  ScheduleConfig sc = train_schedule_;
  sc.after_backward = after_backward;
  auto result = run_pipeline_schedule(sc, groups_.pipeline_links(), [&](int chunk, int k, const at::Tensor& in) {
    model::DropoutContext c = dropout;
    c.batch_offset = batches[k].global_row;
    return forward(chunk, batches[k], in, c, false);
  });

  // The global batch's loss: Σ over micro-batches and data ranks, brought to every stage.
  at::Tensor loss = device_zeros(1, device);
  if (last_stage_) {
    for (const auto& l : result.losses) loss += l.to(at::kDouble);
    loss /= loss_scale.defined() ? loss_scale * double(layout_.dp) : at::scalar_tensor(double(layout_.dp), loss.options());
    groups_.data().all_reduce(loss);
  }
  groups_.pipeline().all_reduce(loss);
  return loss;
}

at::Tensor GptStep::evaluate(const std::vector<MicroBatch>& batches) {
  model::DropoutContext off;
  off.training = false;
  auto result = run_pipeline_schedule(eval_schedule_, groups_.pipeline_links(), [&](int chunk, int k, const at::Tensor& in) {
    return forward(chunk, batches[k], in, off, true);
  });
  at::Tensor totals = device_zeros(2, groups_.device());
  for (const auto& l : result.losses) totals += l.to(at::kDouble);
  return totals;
}

at::Tensor GptStep::reduce_totals(at::Tensor totals) {
  if (last_stage_) groups_.data().all_reduce(totals);
  groups_.pipeline().all_reduce(totals);
  return totals;
}

}  // namespace loom::train
