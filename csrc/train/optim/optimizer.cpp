#include "train/optim/optimizer.h"

#include <ATen/ATen.h>

#include <array>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <utility>
#include <set>
#include <stdexcept>

#include "train/optim/grad_finalize.h"
#include "train/optim/grad_overlap.h"
#include "train/optim/grad_norm.h"

namespace loom::train::optim {
namespace {

const char* const kStateKinds[3] = {"main", "exp_avg", "exp_avg_sq"};

}  // namespace

at::Tensor StepResult::values() const {
  return at::stack({grad_norm.to(at::kDouble), skipped.to(at::kDouble), clip_coefficient.to(at::kDouble),
                    loss_scale.to(at::kDouble)});
}

StepValues StepResult::read() const {
  const at::Tensor host = values().to(at::kCPU).contiguous();  // one copy for all four
  const double* v = host.data_ptr<double>();
  return {float(v[0]), v[1] != 0.0, v[2], v[3], grad_sync_s};
}

Optimizer::Optimizer(model::ParamList params, std::shared_ptr<runtime::ProcessGroups> groups,
                     OptimizerOptions options)
    : params_(std::move(params)), groups_(std::move(groups)), options_(options) {
  if (!groups_) throw std::invalid_argument("optimizer: process groups are null");
  validate(options_.adamw);
  std::set<std::string> names;
  for (const auto& p : params_) {
    if (p.name.empty()) throw std::invalid_argument("optimizer: a parameter has an empty name");
    if (!names.insert(p.name).second)
      throw std::invalid_argument("optimizer: parameter name '" + p.name + "' appears twice");
  }
  GradBufferOptions gopts;
  gopts.bucket_bytes = options_.bucket_bytes;
  gopts.pad_multiple = options_.distributed ? groups_->data().size() : 1;
  gopts.device = groups_->device();
  grads_ = std::make_unique<GradBuffer>(params_, gopts);
  steps_ = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(gopts.device));
  if (options_.overlap_grad_reduce)
    overlap_ = std::make_unique<OverlappedGradReduction>(*grads_, *groups_, options_.distributed);
}

Optimizer::~Optimizer() = default;

void Optimizer::zero_grad() {
  wait_for_params();  // the model is about to be read
  grads_->zero();
}

int64_t Optimizer::step_count() const { return static_cast<int64_t>(steps_.item<float>()); }

int Optimizer::buckets_started_in_backward() const { return overlap_ ? overlap_->started_in_backward() : 0; }

void Optimizer::wait_for_params() { finish_publish(); }

void Optimizer::wait_for_params_of(size_t first, size_t end) {
  if (first > end || end > params_.size())
    throw std::out_of_range("optimizer: parameter range [" + std::to_string(first) + ", " + std::to_string(end) +
                            ") is not inside the " + std::to_string(params_.size()) + " parameters");
  finish_publish_of(first, end);
}

void Optimizer::start_iteration(int num_microbatches) {
  if (num_microbatches < 1)
    throw std::invalid_argument("optimizer: num_microbatches must be >= 1, got " + std::to_string(num_microbatches));
  // Zeroing the gradient buffer touches no parameter, so the gathers may stay in flight.
  if (!forward_waits_for_params_) wait_for_params();
  grads_->zero();
  if (overlap_) overlap_->begin(num_microbatches);
}

void Optimizer::accumulate_grads() { grads_->accumulate(); }

runtime::Communicator& Optimizer::norm_group() {
  return options_.distributed ? groups_->world() : groups_->model_parallel();
}

void Optimizer::init_main_from_params() {
  at::NoGradGuard no_grad;
  for (auto& piece : pieces_) {
    if (piece.main_is_param) continue;
    at::Tensor src = params_[piece.param].tensor.detach();
    piece.main.copy_(src.reshape(-1).narrow(0, piece.param_offset, piece.numel).view(piece.main.sizes()));
  }
}

StepResult Optimizer::step(double lr, LossScaler* scaler) {
  at::NoGradGuard no_grad;
  wait_for_params();  // any the forward did not read: the update rewrites their shards
  const auto sync_start = std::chrono::steady_clock::now();
  if (overlap_ && overlap_->armed())
    overlap_->finish();
  else
    finalize_grads(*grads_, groups_->data(), groups_->tensor(), groups_->embedding(), options_.distributed);
  const double grad_sync_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - sync_start).count();

  std::vector<at::Tensor> all_grads, counted;
  const int tp_rank = groups_->tensor().rank();
  for (const auto& piece : pieces_) {
    all_grads.push_back(piece.grad);
    if (counts_in_grad_norm(params_[piece.param], tp_rank)) counted.push_back(piece.grad);
  }

  // Every decision below is a device tensor: the update is skipped by the device, not by the
  // host, so that the step never waits (adamw.h: a skipped update changes nothing).
  const at::Device device = grads_->data().device();
  const auto on_device = at::TensorOptions().device(device);
  StepResult result;
  result.grad_sync_s = grad_sync_s;
  at::Tensor found_inf;
  if (scaler) {
    scale_grads(all_grads, scaler->scale_tensor().reciprocal());
    found_inf = found_inf_or_nan(all_grads, norm_group(), device);
    scaler->update(found_inf);
    result.loss_scale = scaler->scale_tensor();
  } else {
    result.loss_scale = at::ones({}, on_device.dtype(at::kDouble));
  }
  // The multi-tensor norm on CUDA only: CPU runs equal stand-in device runs bit for bit.
  at::Tensor norm = global_grad_norm(counted, norm_group(), device, options_.fused_adamw && device.is_cuda());
  result.skipped = at::isfinite(norm).logical_not();
  if (found_inf.defined()) {
    result.skipped = result.skipped.logical_or(found_inf);
    norm = at::where(found_inf, at::full({}, NAN, norm.options()), norm);
  }
  result.grad_norm = norm;
  result.clip_coefficient = clip_coefficient(norm, options_.clip_grad);
  scale_grads(all_grads, result.clip_coefficient);
  // A skipped update still runs, on zeroed gradients (inf/NaN would reach the moments).
  grads_->data().masked_fill_(result.skipped, 0.0);
  update_pieces(lr, result.skipped);
  // Unchanged parameters publish their unchanged values: the collectives stay the same each step.
  publish_params(options_.overlap_param_gather && options_.distributed);
  return result;
}

void Optimizer::update_pieces(double lr, const at::Tensor& skip) {
  steps_.add_(skip.logical_not().to(at::kFloat));
  const AdamWStep step{lr, steps_, skip};
  if (!options_.fused_adamw) {
    for (auto& piece : pieces_) {
      adamw_update(piece.main, piece.grad, piece.exp_avg, piece.exp_avg_sq, step, options_.adamw,
                   params_[piece.param].weight_decay);
    }
    return;
  }
  if (fused_groups_.empty() && !pieces_.empty()) {
    // A parameter never spans buckets, so each piece belongs to its parameter's bucket.
    std::vector<size_t> bucket_of(params_.size(), 0);
    for (size_t b = 0; b < grads_->buckets().size(); ++b)
      for (size_t i : grads_->buckets()[b].params) bucket_of[i] = b;
    std::map<std::pair<size_t, bool>, size_t> index;
    for (auto& piece : pieces_) {
      const bool decay = params_[piece.param].weight_decay;
      auto [it, fresh] = index.try_emplace({bucket_of[piece.param], decay}, fused_groups_.size());
      if (fresh) fused_groups_.push_back({{}, decay});
      AdamWTensors& t = fused_groups_[it->second].tensors;
      t.params.push_back(piece.main);
      t.grads.push_back(piece.grad);
      t.exp_avgs.push_back(piece.exp_avg);
      t.exp_avg_sqs.push_back(piece.exp_avg_sq);
    }
  }
  for (auto& group : fused_groups_) fused_adamw_update(group.tensors, step, options_.adamw, group.decay);
}

OptimizerState Optimizer::state_dict() {
  at::NoGradGuard no_grad;
  wait_for_params();
  OptimizerState state;
  for (int kind = 0; kind < 3; ++kind) {
    std::vector<at::Tensor> full = gather_state(kind);
    for (size_t i = 0; i < params_.size(); ++i) {
      state.tensors[std::string(kStateKinds[kind]) + "/" + params_[i].name] = full[i];
    }
  }
  state.values = {{"name", "adamw"}, {"step", step_count()}};
  return state;
}

void Optimizer::load_state_dict(const OptimizerState& state) {
  at::NoGradGuard no_grad;
  wait_for_params();
  const auto& v = state.values;
  if (!v.is_object() || !v.contains("step") || !v["step"].is_number_integer() || v["step"].get<int64_t>() < 0)
    throw std::runtime_error("optimizer state: expected values {\"step\": <non-negative integer>}, got " + v.dump());
  if (v.contains("name") && v["name"] != "adamw")
    throw std::runtime_error("optimizer state: saved by optimizer '" + v["name"].dump() + "', expected \"adamw\"");
  // Check every entry before changing anything.
  std::vector<std::array<at::Tensor, 3>> full(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    for (int kind = 0; kind < 3; ++kind) {
      std::string key = std::string(kStateKinds[kind]) + "/" + params_[i].name;
      auto it = state.tensors.find(key);
      if (it == state.tensors.end()) throw std::runtime_error("optimizer state: missing tensor '" + key + "'");
      const at::Tensor& t = it->second;
      if (!t.defined() || t.scalar_type() != at::kFloat || t.sizes() != params_[i].tensor.sizes()) {
        throw std::runtime_error("optimizer state: tensor '" + key + "' must be fp32 of shape " +
                                 c10::str(params_[i].tensor.sizes()) + ", got " +
                                 (t.defined() ? std::string(c10::toString(t.scalar_type())) + " " + c10::str(t.sizes())
                                              : std::string("undefined")));
      }
      full[i][kind] = t.reshape(-1);
    }
  }
  for (auto& piece : pieces_) {
    at::Tensor* dst[3] = {&piece.main, &piece.exp_avg, &piece.exp_avg_sq};
    for (int kind = 0; kind < 3; ++kind) {
      dst[kind]->copy_(full[piece.param][kind].narrow(0, piece.param_offset, piece.numel).view(dst[kind]->sizes()));
    }
  }
  steps_.fill_(double(v["step"].get<int64_t>()));
  publish_params();
}

}  // namespace loom::train::optim
