// `loom convert --checkpoint SRC --output DST [--iteration N] [layout flags]`: a Loom training
// checkpoint rewritten at another (t, p, v, d, distributed optimizer) with its whole training
// state, so that `loom train` at the new layout resumes as if it had never stopped
// (docs/design/checkpoint_conversion.md):
//   - parameters and the optimizer's fp32 state (main parameters, Adam moments; saved per whole
//     tensor-parallel shard whatever d and the distributed optimizer were) re-cut for the new
//     t and regrouped for the new p and v; the word embedding's pad rows re-padded with zeros;
//     the last stage's tied copy of the word embedding dropped or added;
//   - the optimizer step, scheduler, loss scaler, iteration and consumed samples copied;
//   - DST/config.yaml: SRC's recipe with the new layout.
// There is no RNG state to carry: dropout masks are a function of (seed, step, global
// position) and the data order of (seed, consumed samples), both independent of the layout.
// Streams: one source shard file at a time is held, plus the output shards of one pipeline
// stage.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "convert/layout_request.h"

namespace loom::convert {

struct ReshardRequest {
  std::string checkpoint;            ///< source run directory (with config.yaml) or its checkpoints/
  std::optional<int64_t> iteration;  ///< default: the tracker's
  std::string output_run;            ///< destination run directory
  LayoutRequest layout;
  /// Called after each source shard file is read with (files read, files to read in all).
  std::function<void(int64_t, int64_t)> on_progress;
};

struct ReshardResult {
  int64_t iteration = 0;
  Layout from, to;
  int64_t files_read = 0;
};

/// Throws ConvertInputError or train::CheckpointError naming the file, tensor or field for bad
/// input (a layout the model does not fit, a recipe that does not fit it, a damaged or
/// incomplete source, an output equal to the source), std::runtime_error on an I/O failure.
ReshardResult reshard_checkpoint(const ReshardRequest& request);

}  // namespace loom::convert
