// Tensor-parallel linear layers (docs/design/parallel_layout.md, "Tensor-parallel layers"; Megatron-LM
// ColumnParallelLinear / RowParallelLinear). Inputs and outputs are [s, b, features].
//
// Column-parallel: weight [out/t, in], bias [out/t]. Input region: replicated [s, b, in]
// (copy_to_tensor_model_parallel_region) or, under sequence parallelism, the local sequence
// shard [s/t, b, in] that is all-gathered inside linear_with_sequence_parallel_gather, which
// keeps only the shard for backward and gathers it again there (docs/design/sp_sar.md, "Memory trick").
// Output: [s, b, out/t].
//
// Row-parallel: weight [out, in/t], bias [out] replicated. Input [s, b, in/t]; the partial
// products are all-reduced ([s, b, out]) or, under sequence parallelism, reduce-scattered to
// [s/t, b, out]. The bias is returned separately (added after the reduction, fused into
// bias_dropout_add) and is a sequence-parallel parameter under SP.
//
// Either may carry a LoRA adapter (attach_lora; model/lora.h), sharded as the layer is; its
// update joins the layer's output (column) or partial product before the reduction (row).
#pragma once
#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "model/dropout_context.h"
#include "rules/lora_config.h"
#include "model/parameter.h"
#include "runtime/communicator.h"

namespace loom::model {

class LoraAdapter;
struct LoraBatch;

/// y = all_gather_dim0(x) · wᵀ + b, saving only the local x (and w) for backward; backward
/// all-gathers x again for dW and reduce-scatters dX. x [n, ..., in], w [out, in], b [out].
at::Tensor linear_with_sequence_parallel_gather(const at::Tensor& x, const at::Tensor& weight,
                                                const std::optional<at::Tensor>& bias,
                                                const runtime::CommunicatorPtr& tp);

namespace detail {
/// What both tensor-parallel linear layers hold: the parameters' name prefix, this rank's
/// weight and bias, the tensor-parallel group and whether sequence parallelism is on.
class ParallelLinearState {
 protected:
  ParallelLinearState(std::string name, runtime::CommunicatorPtr tp, bool sequence_parallel)
      : name_(std::move(name)), tp_(std::move(tp)), sequence_parallel_(sequence_parallel) {}
  /// Adds this layer's LoRA adapter for `target` of global layer `layer` (lora.h).
  void attach_lora_adapter(bool column, LoraTarget target, int layer, const LoraConfig& config, uint64_t seed,
                           const at::TensorOptions& options);
  std::string name_;
  at::Tensor weight_, bias_;
  runtime::CommunicatorPtr tp_;
  bool sequence_parallel_;
  std::shared_ptr<const LoraAdapter> lora_;  ///< null: no adapter
};
}  // namespace detail

/// Rank `tp->rank()`'s shard of a full weight [out, in] (and bias [out]) built by the caller.
class ColumnParallelLinear : detail::ParallelLinearState {
 public:
  ColumnParallelLinear(std::string name, const at::Tensor& full_weight,
                       const std::optional<at::Tensor>& full_bias, runtime::CommunicatorPtr tp,
                       bool sequence_parallel, const at::TensorOptions& options);
  /// [s(/t), b, in] -> [s, b, out/t] (+ bias unless skip_bias_add, then add it yourself), plus
  /// the LoRA update when attached (its input dropout per `dropout`; none when null), plus the
  /// served adapters' updates of their tokens when `served` is active (inference,
  /// lora_serving.h).
  at::Tensor forward(const at::Tensor& x, bool skip_bias_add = false, const DropoutContext* dropout = nullptr,
                     const LoraBatch* served = nullptr) const;
  /// Gives this layer a LoRA adapter when config.adapts(target) (else does nothing).
  void attach_lora(LoraTarget target, int layer, const LoraConfig& config, uint64_t seed,
                   const at::TensorOptions& options) {
    attach_lora_adapter(true, target, layer, config, seed, options);
  }
  const at::Tensor& weight() const { return weight_; }
  const at::Tensor& bias() const { return bias_; }  ///< undefined when built without bias
  void collect(ParamList& out) const;
};

/// Rank `tp->rank()`'s shard of a full weight [out, in] (split along `in`) built by the
/// caller; the bias [out] is whole on every rank (an undefined full_bias: no bias, and
/// forward() returns an undefined bias).
class RowParallelLinear : detail::ParallelLinearState {
 public:
  RowParallelLinear(std::string name, const at::Tensor& full_weight, const at::Tensor& full_bias,
                    runtime::CommunicatorPtr tp, bool sequence_parallel,
                    const at::TensorOptions& options);
  /// [s, b, in/t] -> ([s(/t), b, out] without bias, bias [out]), with the LoRA update when
  /// attached (its input dropout per `dropout`; none when null) and the served adapters'
  /// partial updates of their tokens when `served` is active (inference, lora_serving.h).
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& x, const DropoutContext* dropout = nullptr,
                                            const LoraBatch* served = nullptr) const;
  /// Gives this layer a LoRA adapter when config.adapts(target) (else does nothing).
  void attach_lora(LoraTarget target, int layer, const LoraConfig& config, uint64_t seed,
                   const at::TensorOptions& options) {
    attach_lora_adapter(false, target, layer, config, seed, options);
  }
  void collect(ParamList& out) const;
};

}  // namespace loom::model
