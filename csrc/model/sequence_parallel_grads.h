// Step 2 of gradient finalisation (parallel_layout.md): under sequence parallelism the
// replicated parameters used on sequence shards (LayerNorm weight/bias, row-parallel biases,
// position embedding) get gradients from their local tokens only; summing them over the
// tensor-parallel group makes them identical on every TP rank and equal to the single-process
// gradient (sp_sar.md, "Bugs others shipped": LayerNorm grads not all-reduced).
#pragma once
#include "model/parameter.h"
#include "runtime/communicator.h"

namespace loom::model {

/// SUM all-reduces, over `tp`, the gradients of every param with sequence_parallel set
/// (coalesced into one buffer per dtype). Call after the last backward of a step, before
/// clipping. Params without a gradient are skipped. No-op for a group of size 1.
void allreduce_sequence_parallel_grads(const ParamList& params, runtime::Communicator& tp);

}  // namespace loom::model
