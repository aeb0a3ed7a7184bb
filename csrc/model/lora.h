// A LoRA adapter on a tensor-parallel linear (docs/design/lora.md): y = W x + (alpha/r)·B A x,
// A [r, in], B [out, r]. A starts Kaiming-uniform as in Hugging Face PEFT (U(±1/sqrt(in)),
// drawn from its full tensor like every Loom parameter, model/init.h), B zero, so step 0 is
// the base model. Optional dropout on the adapter's input, keyed by global position like every
// Loom dropout (dropout_context.h), so every layout draws the same mask.
//
// Sharded as its base layer (torchtitan's and Megatron-Bridge's rule):
//   column-parallel base W [out/t, in]: A replicated, B [out/t, r] sharded like the output.
//     The rank-r activation A x is computed on the base's input as it arrives (the sequence
//     shard under sequence parallelism, then all-gathered: r wide instead of in wide) and
//     entered into the tensor-parallel region, whose backward sums the partial gradients.
//     Under SP, A's gradient covers this rank's tokens only (Param::sequence_parallel).
//   row-parallel base W [out, in/t]: A [r, in/t] sharded on the input, B replicated; the rank's
//     (alpha/r)·B A_r x_r is added to the base's partial product before the base's one
//     all-reduce / reduce-scatter, so the adapter costs no communication. B's gradient on each
//     rank is then the part from its input shard: summed over the tensor group
//     (Param::sequence_parallel, with or without sequence parallelism).
#pragma once
#include <ATen/core/Tensor.h>

#include <string>

#include "model/dropout_context.h"
#include "rules/lora_config.h"
#include "model/parameter.h"
#include "runtime/communicator.h"

namespace loom::model {

/// Dropout sites of the adapters' inputs (after loom::ops::DropoutSite's 0..3): 16 + the
/// target's bit index, so each adapter of a layer draws its own mask.
uint32_t lora_dropout_site(LoraTarget target);

/// The parameter names of the adapter on linear `linear_name` ("layers.0.self_attention.linear_qkv").
std::string lora_a_name(const std::string& linear_name);  ///< "<linear>.lora_a.weight"
std::string lora_b_name(const std::string& linear_name);  ///< "<linear>.lora_b.weight"

/// The full initial A [r, in]: U(-1/sqrt(in), 1/sqrt(in)) drawn under its name (PEFT's
/// kaiming_uniform_(a = sqrt(5))).
at::Tensor initial_lora_a(uint64_t seed, const std::string& linear_name, int64_t rank, int64_t in_features);

/// The merged weight W + scale·B A of full (or matching shard) tensors w [out, in], a [r, in],
/// b [out, r], computed in float32 and returned in w's dtype.
at::Tensor merge_lora_weight(const at::Tensor& w, const at::Tensor& a, const at::Tensor& b, double scale);

enum class LoraBase { kColumnParallel, kRowParallel };

class LoraAdapter {
 public:
  /// The adapter of target `target` on the linear `linear_name` of global layer `layer`, whose
  /// full weight is [out_features, in_features]; this rank's shards per `base`.
  LoraAdapter(const std::string& linear_name, LoraBase base, LoraTarget target, int layer, int64_t in_features,
              int64_t out_features, const LoraConfig& config, uint64_t seed, runtime::CommunicatorPtr tp,
              bool sequence_parallel, const at::TensorOptions& options);
  /// A trained adapter for inference (`loom serve --lora`, lora_serving.h): the full a [r, in]
  /// and b [out, r] of a checkpoint, this rank's shards per `base` in `options`' dtype and
  /// device, its update scaled by `scale` (alpha / r); no dropout, no sequence parallelism.
  LoraAdapter(const std::string& linear_name, LoraBase base, const at::Tensor& full_a, const at::Tensor& full_b,
              double scale, runtime::CommunicatorPtr tp, const at::TensorOptions& options);

  /// Column-parallel base: x as the base receives it, [s(/t), b, in] -> the scaled update
  /// [s, b, out/t] to add to the base's output.
  at::Tensor column_update(const at::Tensor& x, const DropoutContext* dropout) const;
  /// Row-parallel base: x [s, b, in/t] -> this rank's part of the scaled update [s, b, out],
  /// to add to the base's partial product before its reduction.
  at::Tensor row_partial_update(const at::Tensor& x, const DropoutContext* dropout) const;
  void collect(ParamList& out) const;
  const at::Tensor& a() const { return a_; }
  const at::Tensor& b() const { return b_; }

 private:
  /// x with the adapter's dropout (none without a context, at inference or with p = 0); x is
  /// the block [seq_offset.., 0.., feature_offset..] of the global [s, B, in_features] input.
  at::Tensor dropped(const at::Tensor& x, const DropoutContext* dropout, int64_t seq_length, int64_t seq_offset,
                     int64_t feature_offset) const;

  std::string name_;
  LoraBase base_;
  int layer_;
  uint32_t site_;
  int64_t in_features_;
  double scale_, dropout_;
  runtime::CommunicatorPtr tp_;
  bool sequence_parallel_;
  at::Tensor a_, b_;
};

}  // namespace loom::model
