// The document mask of packed rows (docs/design/finetune.md, "Packed sequences"): a row holding
// several examples one after another attends only within each example, a block-diagonal causal
// mask (torchtitan's document mask; Megatron-Core reaches the same with PackedSeqParams'
// cu_seqlens). Built once per stage forward from the micro-batch's segment ids and handed to
// every layer's attention core (attention.h).
#pragma once
#include <ATen/core/Tensor.h>

namespace loom::model {

/// segment_ids [b, s] (integer: the example of each position) -> bool [b, 1, s, s], true where
/// query i and key j lie in different examples (Megatron's convention, true = masked out;
/// broadcast over the heads). Together with the causal mask it leaves each position the earlier
/// positions of its own example. Throws std::invalid_argument for anything but an integer
/// [b, s] tensor.
at::Tensor cross_segment_mask(const at::Tensor& segment_ids);

/// The same mask in at::scaled_dot_product_attention's convention (true = attends), causal
/// included: bool [b, 1, s, s], key j visible to query i when j <= i and both are in one
/// example. `cross_segment` is cross_segment_mask's output.
at::Tensor attending_mask(const at::Tensor& cross_segment);

}  // namespace loom::model
