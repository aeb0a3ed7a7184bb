// Several trained LoRA adapters served over one base model in one forward (`loom serve --lora`,
// docs/serving.md "LoRA adapters"; the idea of vLLM's multi-LoRA batching, Punica: Chen et al.
// 2023, "Punica: Multi-Tenant LoRA Serving"). The base weights are shared; each token of the flat
// batch belongs to one adapter or to none, and every adapted linear adds
//   y[tokens of i] += (alpha_i / r_i) · B_i A_i x[tokens of i]
// for each adapter i present in the batch: the tokens of adapter i are gathered (index_select),
// run through A_i then B_i and scattered back (index_add). Adapters are sharded as in training
// (model/lora.h): column-parallel base, A replicated and B sharded like the output; row-parallel
// base, A sharded on the input and B replicated, its partial update reduced with the base's
// partial product. A forward without adapter tokens runs the base path unchanged.
#pragma once
#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/lora.h"
#include "rules/lora_config.h"
#include "runtime/communicator.h"

namespace loom::model {

/// Column- or row-parallel, by the adapted linear's name ("layers.3.self_attention.linear_qkv":
/// linear_qkv and linear_fc1 are column-parallel, linear_proj and linear_fc2 row-parallel).
/// Throws std::invalid_argument naming the linear for another name.
LoraBase lora_base_of(const std::string& linear_name);

/// This rank's shards of every served adapter, per adapted linear of its pipeline stage.
class LoraBank {
 public:
  /// Adapters of layers [first_layer, first_layer + num_layers) (this stage's), sharded over
  /// `tp`, in `options`' dtype and device.
  LoraBank(int first_layer, int num_layers, runtime::CommunicatorPtr tp, at::TensorOptions options);

  /// Adds the next adapter (its index: size() before the call) from the full tensors of an
  /// adapter checkpoint ("<linear>.lora_a.weight" [r, in], "<linear>.lora_b.weight" [out, r],
  /// float32 or any float dtype), scaled by config.scale(). Layers of other stages are skipped.
  /// Throws std::invalid_argument naming `what` and the tensor when an A has no B (or the
  /// reverse), their ranks differ from config.dim, or a name is not an adapted linear's.
  void add(const std::map<std::string, at::Tensor>& full, const LoraConfig& config, const std::string& what);
  int size() const { return count_; }
  /// The adapters of `linear` by index (null entries: that adapter leaves it alone); null when
  /// no adapter adapts it.
  const std::vector<std::shared_ptr<const LoraAdapter>>* adapters(const std::string& linear) const;

 private:
  int first_layer_, num_layers_;
  runtime::CommunicatorPtr tp_;
  at::TensorOptions options_;
  int count_ = 0;
  std::map<std::string, std::vector<std::shared_ptr<const LoraAdapter>>> by_linear_;
};

/// One forward's adapter tokens: for each adapter present, the indices of its tokens among the
/// forward's flattened [n · b] tokens (int64 on the stage's device). Tokens not listed run
/// the base alone.
struct LoraBatch {
  const LoraBank* bank = nullptr;
  std::vector<int> adapter;        ///< bank index of each group
  std::vector<at::Tensor> tokens;  ///< int64 [m_g], the group's token indices, distinct

  bool active() const { return bank != nullptr && !adapter.empty(); }
  /// Column-parallel linear `linear`: y [n, b, out/t] (its base output, modified in place and
  /// returned) plus each group's update of x [n, b, in] on its tokens.
  at::Tensor add_column_updates(const std::string& linear, const at::Tensor& x, at::Tensor y) const;
  /// Row-parallel linear `linear`: the partial product [n, b, out] (modified in place and
  /// returned) plus each group's partial update of x [n, b, in/t], before the reduction.
  at::Tensor add_row_partial_updates(const std::string& linear, const at::Tensor& x, at::Tensor partial) const;
};

}  // namespace loom::model
