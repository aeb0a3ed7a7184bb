#include "model/lora.h"

#include <ATen/ATen.h>

#include <cmath>

#include "loom_ops/ops.h"
#include "model/init.h"
#include "model/mappings.h"

namespace loom::model {

uint32_t lora_dropout_site(LoraTarget target) {
  uint32_t bit = 0;
  while (bit < 8 && (target & (1u << bit)) == 0) ++bit;
  return 16 + bit;
}

std::string lora_a_name(const std::string& linear_name) { return linear_name + ".lora_a.weight"; }
std::string lora_b_name(const std::string& linear_name) { return linear_name + ".lora_b.weight"; }

at::Tensor initial_lora_a(uint64_t seed, const std::string& linear_name, int64_t rank, int64_t in_features) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  return full_uniform(seed, lora_a_name(linear_name), {rank, in_features}, -bound, bound);
}

at::Tensor merge_lora_weight(const at::Tensor& w, const at::Tensor& a, const at::Tensor& b, double scale) {
  const at::Tensor update = b.to(at::kFloat).mm(a.to(at::kFloat)) * scale;
  return (w.to(at::kFloat) + update.to(w.device())).to(w.scalar_type());
}

LoraAdapter::LoraAdapter(const std::string& linear_name, LoraBase base, LoraTarget target, int layer,
                         int64_t in_features, int64_t out_features, const LoraConfig& config, uint64_t seed,
                         runtime::CommunicatorPtr tp, bool sequence_parallel, const at::TensorOptions& options)
    : name_(linear_name),
      base_(base),
      layer_(layer),
      site_(lora_dropout_site(target)),
      in_features_(in_features),
      scale_(config.scale()),
      dropout_(config.dropout),
      tp_(std::move(tp)),
      sequence_parallel_(sequence_parallel) {
  const at::Tensor full_a = initial_lora_a(seed, linear_name, config.dim, in_features);
  // host: the full initial B (zero), sharded then moved like every initial tensor (init.h)
  const at::Tensor full_b = at::zeros({out_features, config.dim});
  const bool column = base_ == LoraBase::kColumnParallel;
  a_ = make_parameter(column ? full_a : shard(full_a, 1, tp_->rank(), tp_->size()), options);
  b_ = make_parameter(column ? shard(full_b, 0, tp_->rank(), tp_->size()) : full_b, options);
}

LoraAdapter::LoraAdapter(const std::string& linear_name, LoraBase base, const at::Tensor& full_a,
                         const at::Tensor& full_b, double scale, runtime::CommunicatorPtr tp,
                         const at::TensorOptions& options)
    : name_(linear_name),
      base_(base),
      layer_(0),
      site_(0),
      in_features_(full_a.size(1)),
      scale_(scale),
      dropout_(0.0),
      tp_(std::move(tp)),
      sequence_parallel_(false) {
  const bool column = base_ == LoraBase::kColumnParallel;
  a_ = (column ? full_a : shard(full_a, 1, tp_->rank(), tp_->size())).to(options).contiguous();
  b_ = (column ? shard(full_b, 0, tp_->rank(), tp_->size()) : full_b).to(options).contiguous();
}

at::Tensor LoraAdapter::dropped(const at::Tensor& x, const DropoutContext* dropout, int64_t seq_length,
                                int64_t seq_offset, int64_t feature_offset) const {
  if (!dropout || dropout_ <= 0.0) return x;
  ops::DropoutSpec spec = dropout->hidden(dropout_, layer_, site_, seq_length, seq_offset, x.size(1), in_features_);
  if (spec.p <= 0.0) return x;
  spec.block.offset[2] = feature_offset;
  return ops::dropout(x, spec);
}

at::Tensor LoraAdapter::column_update(const at::Tensor& x, const DropoutContext* dropout) const {
  const int64_t s_local = x.size(0);
  const int64_t t = tp_->size();
  at::Tensor u;
  if (sequence_parallel_) {
    // [s/t, b, in] -> [s/t, b, r] -> all-gathered [s, b, r] (backward: reduce-scatter of the
    // partial gradients of the sharded B).
    u = at::linear(dropped(x, dropout, s_local * t, tp_->rank() * s_local, 0), a_);
    u = gather_from_sequence_parallel_region(u, tp_);
  } else {
    // Replicated input: A x is the same on every rank; the region's backward all-reduces the
    // partial gradients of the sharded B, so A's gradient is whole on every rank.
    u = copy_to_tensor_model_parallel_region(at::linear(dropped(x, dropout, s_local, 0, 0), a_), tp_);
  }
  return at::linear(u, b_) * scale_;
}

at::Tensor LoraAdapter::row_partial_update(const at::Tensor& x, const DropoutContext* dropout) const {
  const int64_t shard = x.size(-1);
  const at::Tensor u = at::linear(dropped(x, dropout, x.size(0), 0, tp_->rank() * shard), a_);
  return at::linear(u, b_) * scale_;
}

void LoraAdapter::collect(ParamList& out) const {
  const bool column = base_ == LoraBase::kColumnParallel;
  Param a{lora_a_name(name_), a_, column ? -1 : 1};
  a.sequence_parallel = column && sequence_parallel_;  // its gradient covers this rank's tokens
  Param b{lora_b_name(name_), b_, column ? 0 : -1};
  b.sequence_parallel = !column && tp_->size() > 1;  // the part of its gradient from this rank's input shard
  out.push_back(a);
  out.push_back(b);
}

}  // namespace loom::model
