// Tables of `loom plan --measure`: which layouts to run, and their measured step time and peak
// memory beside the prediction, re-ranked by measurement.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "planner/measure.h"
#include "planner/search.h"

namespace loom::planner {

/// A measured candidate and its place in the predicted ranking.
struct MeasuredLayout {
  std::size_t predicted_rank = 0;  ///< 1-based
  Candidate candidate;
  Measurement measured;
};

/// Indices (0-based, ascending) of the layouts to run among ranked ones whose predicted step
/// times are `seconds` (ascending): the first k, or with `spread` the best, the worst and, for
/// k − 2 targets evenly spaced in predicted time between them, the nearest layout not yet
/// taken. Spacing in time rather than in rank keeps near-ties (most of a ranking) from
/// crowding the sample, so the measured order can confirm the predicted one.
std::vector<std::size_t> pick_for_measurement(const std::vector<double>& seconds, std::size_t k, bool spread);

/// Sorts by measured step time (successful runs first), then by predicted rank.
void rank_by_measurement(std::vector<MeasuredLayout>& rows);

/// "0.412 s/step, peak 812 MiB" or "out of memory: <detail>".
std::string describe_measurement(const Measurement& m);

/// Terminal table (measured order): measured and predicted rank, layout, predicted and
/// measured s/step, ratio, peak MiB, status; then whether the predicted best and worst of the
/// measured set are the measured best and worst, and Spearman's rank correlation.
std::string format_measured_table(const std::vector<MeasuredLayout>& rows, const MeasureOptions& options);

/// CSV with a header: measured_rank, predicted_rank, tp, pp, vp, dp, mbs, sp, recompute,
/// dist_opt, predicted_s, measured_s (fastest run), peak_mib, predicted_memory_gib, status,
/// detail, run_seconds (every successful run, ';'-separated).
std::string format_measured_csv(const std::vector<MeasuredLayout>& rows);

/// Spearman's rank correlation of predicted and measured step times over the successful rows
/// (0 when fewer than 2).
double spearman_rank_correlation(const std::vector<MeasuredLayout>& rows);

}  // namespace loom::planner
