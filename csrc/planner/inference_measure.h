// Confirming the inference planner with real runs (`loom plan infer --measure K`): each chosen
// layout (TP, PP, batch) serves a checkpoint on this machine through the serving engine, one
// replica of t·p local ranks of `loom serve --bench-out` (serve/engine_benchmark.h: rounds of
// `batch` requests of the planned prompt and output lengths, arriving together), and its
// measured time to first token, per-token latency and tokens/s are set beside the prediction
// with their relative errors (docs/serving.md, "Measuring a layout"). A failed run is
// classified as training's --measure does (measure.h) and the next layout runs.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "planner/inference_search.h"
#include "planner/measure.h"
#include "planner/model_shape.h"

namespace loom::planner {

struct InferenceMeasureOptions {
  std::string loom_exe;     ///< the `loom` executable to start
  std::string checkpoint;   ///< --checkpoint: run directory or its checkpoints/ folder
  int prompt_tokens = 0;    ///< of the planned workload
  int output_tokens = 0;
  int rounds = 2;           ///< --measure-rounds: timed rounds of `batch` requests
  double timeout_s = 300;   ///< --measure-timeout, per layout; the ranks are then stopped
  std::string work_dir = "plan_infer_measure";  ///< --measure-dir: <dir>/layout-<rank>.json
};

struct InferenceMeasurement {
  RunStatus status = RunStatus::error;
  double ttft_ms = 0;       ///< mean submit → first token
  double token_ms = 0;      ///< mean interval between generated tokens
  double request_ms = 0;    ///< mean submit → last token
  double tokens_per_s = 0;  ///< generated tokens/s of the one replica
  double peak_mib = 0;      ///< largest rank's peak resident memory
  double wall_seconds = 0;  ///< the whole run, start-up included
  std::string detail;       ///< failed runs: the first failing rank's error
};

/// A measured candidate and its place in the predicted ranking.
struct MeasuredInferenceLayout {
  std::size_t predicted_rank = 0;  ///< 1-based
  InferenceCandidate candidate;
  InferenceMeasurement measured;
};

/// The model shape in the newest committed iteration's metadata.json of `checkpoint` (a run
/// directory holding checkpoints/, or that folder), read by the checkpoints' one codec
/// (rules/model_shape_json.h: max_position_embeddings as seq_length) and validated. Throws
/// std::invalid_argument naming --checkpoint and the file when there is no tracker or the
/// metadata lacks a field.
ModelShape checkpoint_model_shape(const std::string& checkpoint);

/// Serves `layout` (one replica: t·p ranks, --max-batch = batch) and measures it; `rank` names
/// the result file. Never throws for a failed run: it is classified.
InferenceMeasurement measure_inference_layout(const InferenceMeasureOptions& options, const InferenceLayout& layout,
                                              std::size_t rank);

/// Relative error of a measurement against its prediction, (measured − predicted) / predicted
/// (0 when the prediction is 0).
double relative_error(double measured, double predicted);

/// Terminal table in predicted order: rank, layout, then TTFT, per-token latency and tokens/s
/// of one replica, each predicted / measured / error, and the status (with the failure's
/// detail); then the mean absolute error of each figure over the successful rows.
std::string format_inference_measured_table(const std::vector<MeasuredInferenceLayout>& rows);

/// CSV with a header: predicted_rank, tp, pp, batch, predicted_ttft_ms, measured_ttft_ms,
/// ttft_error, predicted_token_ms, measured_token_ms, token_error, predicted_tokens_per_s,
/// measured_tokens_per_s, tokens_per_s_error, measured_request_ms, peak_mib, status, detail.
std::string format_inference_measured_csv(const std::vector<MeasuredInferenceLayout>& rows);

}  // namespace loom::planner
