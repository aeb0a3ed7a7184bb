// Which TensorBoard series a record becomes: the one rule that maps Loom's metrics records and
// `loom eval` results to tags (docs/design/tensorboard.md, "Tags"), so that the event files hold
// exactly what metrics.jsonl and the results JSON hold.
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <vector>

#include "runlog/event_file.h"

namespace loom::runlog {

/// The scalars of one metrics.jsonl record (its step is record["step"]): every number in it
/// except "step" and "max_steps" (booleans are not numbers here) as "<kind>/<field>" — kind
/// "train" when absent, e.g. "train/loss", "train/tokens_per_s", "validation/val_loss" — and,
/// for a record with "val_loss", "<kind>/val_perplexity" = exp(val_loss).
std::vector<Scalar> record_scalars(const nlohmann::json& record);

/// The scalars of a `loom eval` results JSON (lm-evaluation-harness's shape): every number of
/// results.<task> as "eval/<task>/<metric>", the harness's ",none" filter suffix dropped
/// ("eval/lambada/acc", "eval/lambada/acc_stderr"); "N/A" stderrs are left out.
std::vector<Scalar> eval_result_scalars(const nlohmann::json& results);

}  // namespace loom::runlog
