// The document mask of packed rows (docs/design/finetune.md, "Packed sequences"): a row holding
// several examples one after another attends only within each example, a block-diagonal causal
// mask (torchtitan's document mask; Megatron-Core reaches the same with PackedSeqParams'
// cu_seqlens). Built once per stage forward from the micro-batch's segment ids and handed to
// every layer's attention core (attention.h), which keeps a reference for backward, not a copy.
#pragma once
#include <ATen/core/Tensor.h>

namespace loom::model {

/// segment_ids [b, s] (integer: the example of each position) -> bool [b, 1, s, s], true where
/// query i and key j lie in different examples (Megatron's convention, true = masked out;
/// broadcast over the heads). Together with the causal mask it leaves each position the earlier
/// positions of its own example. Throws std::invalid_argument for anything but an integer
/// [b, s] tensor.
at::Tensor cross_segment_mask(const at::Tensor& segment_ids);

/// The same mask, causal included, as an additive bias for at::scaled_dot_product_attention:
/// [b, 1, s, s] of `dtype`, 0 where key j is visible to query i (j <= i, one example), -inf
/// elsewhere. No row is fully masked (every position sees itself). A bias rather than SDPA's
/// bool mask, which ATen would convert to this bias again in every layer and keep per layer.
at::Tensor sdpa_document_bias(const at::Tensor& cross_segment, at::ScalarType dtype);

/// A packed micro-batch's mask in the forms the attention cores take.
struct DocumentMask {
  at::Tensor cross_segment;  ///< cross_segment_mask(): for loom's softmax / core_attention (with causal)
  at::Tensor sdpa_bias;      ///< sdpa_document_bias(): for the fused core (use_flash_attention only)
  /// False: each row is one sequence (the causal mask alone).
  bool active() const { return cross_segment.defined(); }
};

/// The mask of `segment_ids` [b, s]; the SDPA bias (in `dtype`) only `with_sdpa_bias`.
DocumentMask document_mask(const at::Tensor& segment_ids, bool with_sdpa_bias, at::ScalarType dtype);

}  // namespace loom::model
