// Global gradient norm, clipping and the inf/NaN check (docs/design/parallel_layout.md, "Gradient
// finalisation" step 4; Megatron's clip_grad_norm_fp32 and count_zeros rules).
//
// A gradient counts towards the norm on this rank only if its parameter is not the tied
// embedding duplicate and is tensor-parallel or this is tensor rank 0, so that every distinct
// value is counted exactly once across the model-parallel group. The local sums of squares are
// SUM all-reduced over `group`: the model-parallel group when every data-parallel rank holds the
// whole reduced gradient, the world when each data rank holds a shard (distributed optimizer).
//
// Every result is a 0-dim tensor on the gradients' device: nothing here waits for the device
// (docs/design/devices.md, "Host waits").
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <vector>

#include "runtime/communicator.h"
#include "model/parameter.h"

namespace loom::train::optim {

/// The counting rule above.
bool counts_in_grad_norm(const model::Param& param, int tensor_rank);

/// sqrt(Σ over `grads` of Σ g²), the sum taken in fp32 and all-reduced over `group`.
/// `grads`: fp32 tensors on `device` (already filtered by the counting rule; may be empty on
/// some ranks, so the collective runs on `device` regardless). Returns a float32 0-dim tensor on
/// `device`, the same value on every member (inf/NaN if any gradient is). `multi_tensor`: the
/// local norms from one multi-tensor kernel (_foreach_norm) and their squares summed in one
/// reduction, instead of a norm and an add per tensor (equal within fp32 rounding).
at::Tensor global_grad_norm(const std::vector<at::Tensor>& grads, runtime::Communicator& group,
                            at::Device device = at::kCPU, bool multi_tensor = false);

/// Megatron's clip coefficient max_norm/(norm + 1e-6) in float64, or 1 when that is >= 1,
/// when max_norm <= 0 (clipping off) or when the norm is not finite. `norm`: a 0-dim tensor;
/// the result is a float64 0-dim tensor on its device.
at::Tensor clip_coefficient(const at::Tensor& norm, double max_norm);

/// Multiplies every tensor in place by `coefficient`, a 0-dim tensor on their device (rounded
/// to fp32 as a host scalar would be).
void scale_grads(const std::vector<at::Tensor>& grads, const at::Tensor& coefficient);

/// A bool 0-dim tensor on `device`, true on every member of `group` if any element of any
/// local tensor is inf or NaN on any member (a MAX all-reduce of the local flag).
at::Tensor found_inf_or_nan(const std::vector<at::Tensor>& grads, runtime::Communicator& group,
                            at::Device device = at::kCPU);

}  // namespace loom::train::optim
