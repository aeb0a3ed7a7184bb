// Region mappings between tensor-parallel and sequence-parallel regions, as autograd
// functions, following Megatron-Core's tensor_parallel/mappings naming (docs/design/conventions.md) and
// the transitions of docs/design/sp_sar.md ("Regions of a transformer layer under TP + SP"):
//
//   name                                        forward              backward
//   copy_to_tensor_model_parallel_region        identity (f)         all-reduce
//   reduce_from_tensor_model_parallel_region    all-reduce (f̄)      identity
//   scatter_to_tensor_model_parallel_region     split last dim       all-gather last dim
//   gather_from_tensor_model_parallel_region    all-gather last dim  split last dim
//   scatter_to_sequence_parallel_region         split dim 0          all-gather dim 0
//   gather_from_sequence_parallel_region        all-gather dim 0 (g) reduce-scatter dim 0
//                                                                    (or split, see below)
//   reduce_scatter_to_sequence_parallel_region  reduce-scatter (ḡ)   all-gather dim 0
//
// All communication of the model goes through this file. With a TP group of size 1 every
// mapping returns its input unchanged. Activations are [s, b, h], so "dim 0" is the sequence.
#pragma once
#include <ATen/core/Tensor.h>

#include "runtime/communicator.h"

namespace loom::model {

using runtime::CommunicatorPtr;

at::Tensor copy_to_tensor_model_parallel_region(const at::Tensor& x, const CommunicatorPtr& tp);
at::Tensor reduce_from_tensor_model_parallel_region(const at::Tensor& x,
                                                    const CommunicatorPtr& tp);
/// Keeps rank r's 1/t slice of the last dimension (which must divide by t).
at::Tensor scatter_to_tensor_model_parallel_region(const at::Tensor& x, const CommunicatorPtr& tp);
/// Concatenates every rank's x along the last dimension, in rank order.
at::Tensor gather_from_tensor_model_parallel_region(const at::Tensor& x,
                                                    const CommunicatorPtr& tp);
/// Keeps rank r's rows [r·n/t, (r+1)·n/t) of dim 0 (n must divide by t).
at::Tensor scatter_to_sequence_parallel_region(const at::Tensor& x, const CommunicatorPtr& tp);
/// [n, ...] -> [n·t, ...]. Backward reduce-scatters the gradient when the consumer is a
/// tensor-parallel region (each rank holds a partial gradient); with
/// tensor_parallel_output_grad = false (consumer replicated) it just keeps the local slice.
at::Tensor gather_from_sequence_parallel_region(const at::Tensor& x, const CommunicatorPtr& tp,
                                                bool tensor_parallel_output_grad = true);
/// [n, ...] -> [n/t, ...], summing over ranks.
at::Tensor reduce_scatter_to_sequence_parallel_region(const at::Tensor& x,
                                                      const CommunicatorPtr& tp);

/// Plain (not differentiable) collectives used inside fused autograd functions.
namespace comm {
at::Tensor all_gather_dim0(const at::Tensor& x, runtime::Communicator& tp);
at::Tensor reduce_scatter_dim0(const at::Tensor& x, runtime::Communicator& tp);
at::Tensor all_reduce(const at::Tensor& x, runtime::Communicator& tp,
                      runtime::ReduceOp op = runtime::ReduceOp::kSum);  ///< out of place
at::Tensor all_gather_last_dim(const at::Tensor& x, runtime::Communicator& tp);
at::Tensor split_dim(const at::Tensor& x, int64_t dim, const runtime::Communicator& tp);
}  // namespace comm

}  // namespace loom::model
