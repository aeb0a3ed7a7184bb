#include "planner/measure_report.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "planner/text_io.h"

namespace loom::planner {
namespace {

constexpr double kGiB = 1073741824.0;

bool ok(const MeasuredLayout& r) { return r.measured.status == RunStatus::ok; }

// Ranks (1-based, ties averaged) of values.
std::vector<double> ranks_of(const std::vector<double>& v) {
  std::vector<std::size_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return v[a] < v[b]; });
  std::vector<double> r(v.size());
  for (std::size_t i = 0; i < idx.size();) {
    std::size_t j = i;
    while (j + 1 < idx.size() && v[idx[j + 1]] == v[idx[i]]) ++j;
    for (std::size_t k = i; k <= j; ++k) r[idx[k]] = (double(i) + double(j)) / 2 + 1;
    i = j + 1;
  }
  return r;
}

}  // namespace

std::vector<std::size_t> pick_for_measurement(const std::vector<double>& seconds, std::size_t k, bool spread) {
  const std::size_t n = seconds.size();
  std::vector<std::size_t> out;
  k = std::min(k, n);
  if (!spread || k == n || k <= 1) {
    for (std::size_t i = 0; i < k; ++i) out.push_back(i);
    return out;
  }
  std::vector<bool> taken(n, false);
  taken[0] = taken[n - 1] = true;
  const double lo = seconds.front(), hi = seconds.back();
  for (std::size_t j = 1; j + 1 < k; ++j) {
    const double target = lo + (hi - lo) * double(j) / double(k - 1);
    std::size_t best = n;
    for (std::size_t i = 0; i < n; ++i)
      if (!taken[i] && (best == n || std::abs(seconds[i] - target) < std::abs(seconds[best] - target))) best = i;
    taken[best] = true;
  }
  for (std::size_t i = 0; i < n; ++i)
    if (taken[i]) out.push_back(i);
  return out;
}

void rank_by_measurement(std::vector<MeasuredLayout>& rows) {
  std::stable_sort(rows.begin(), rows.end(), [](const MeasuredLayout& a, const MeasuredLayout& b) {
    if (ok(a) != ok(b)) return ok(a);
    if (ok(a) && a.measured.step_seconds != b.measured.step_seconds)
      return a.measured.step_seconds < b.measured.step_seconds;
    return a.predicted_rank < b.predicted_rank;
  });
}

std::string describe_measurement(const Measurement& m) {
  if (m.status == RunStatus::ok)
    return fmt::format("{:.3f} s/step, peak {:.0f} MiB", m.step_seconds, m.peak_mib);
  return fmt::format("{}: {}", to_string(m.status), m.detail);
}

double spearman_rank_correlation(const std::vector<MeasuredLayout>& rows) {
  std::vector<double> pred, meas;
  for (const auto& r : rows)
    if (ok(r)) {
      pred.push_back(r.candidate.step_seconds());
      meas.push_back(r.measured.step_seconds);
    }
  if (pred.size() < 2) return 0;
  const auto rp = ranks_of(pred), rm = ranks_of(meas);
  const double n = double(rp.size()), mean = (n + 1) / 2;
  double cov = 0, vp = 0, vm = 0;
  for (std::size_t i = 0; i < rp.size(); ++i) {
    cov += (rp[i] - mean) * (rm[i] - mean);
    vp += (rp[i] - mean) * (rp[i] - mean);
    vm += (rm[i] - mean) * (rm[i] - mean);
  }
  return vp > 0 && vm > 0 ? cov / std::sqrt(vp * vm) : 0;
}

std::string format_measured_table(const std::vector<MeasuredLayout>& rows, const MeasureOptions& opt) {
  std::string s = fmt::format(
      "Measured on this machine ({} steps per run, mean of steps {}..{}; with repeats the fastest run, "
      "runs± = (slowest − fastest)/fastest; pred MiB = the memory model's worst stage incl. reserve, "
      "peak = largest rank RSS):\n",
      opt.steps, opt.skip_steps + 1, opt.steps);
  s += fmt::format("{:>4} {:>4}  {:<38} {:>11} {:>10} {:>6} {:>9} {:>9} {:>9}  {}\n", "meas", "pred", "layout",
                   "predicted s", "measured s", "runs±", "meas/pred", "pred MiB", "peak MiB", "status");
  std::size_t rank = 0;
  for (const auto& r : rows) {
    const bool good = ok(r);
    s += fmt::format("{:>4} {:>4}  {:<38} {:>11.3f} {:>10} {:>6} {:>9} {:>9.0f} {:>9.0f}  {}\n",
                     good ? std::to_string(++rank) : std::string("-"), r.predicted_rank,
                     r.candidate.layout.describe(), r.candidate.step_seconds(),
                     good ? fmt::format("{:.3f}", r.measured.step_seconds) : std::string("-"),
                     r.measured.run_seconds.size() > 1 ? fmt::format("{:.0f}%", 100 * r.measured.spread())
                                                       : std::string("-"),
                     good ? fmt::format("{:.2f}", r.measured.step_seconds / r.candidate.step_seconds())
                          : std::string("-"),
                     r.candidate.memory.terms.total() / (1 << 20), r.measured.peak_mib,
                     good ? std::string("ok") : describe_measurement(r.measured));
  }
  std::vector<const MeasuredLayout*> good;
  for (const auto& r : rows)
    if (ok(r)) good.push_back(&r);
  if (good.size() >= 2) {
    auto by_pred = [](const MeasuredLayout* a, const MeasuredLayout* b) { return a->predicted_rank < b->predicted_rank; };
    const auto* pred_best = *std::min_element(good.begin(), good.end(), by_pred);
    const auto* pred_worst = *std::max_element(good.begin(), good.end(), by_pred);
    s += fmt::format("predicted best is measured best: {}; predicted worst is measured worst: {}; "
                     "Spearman rank correlation {:.2f}\n",
                     pred_best == good.front() ? "yes" : "no", pred_worst == good.back() ? "yes" : "no",
                     spearman_rank_correlation(rows));
  }
  return s;
}

std::string format_measured_csv(const std::vector<MeasuredLayout>& rows) {
  std::string s =
      "measured_rank,predicted_rank,tp,pp,vp,dp,mbs,sp,recompute,dist_opt,predicted_s,measured_s,"
      "peak_mib,predicted_memory_gib,status,detail,run_seconds\n";
  std::size_t rank = 0;
  for (const auto& r : rows) {
    const Layout& L = r.candidate.layout;
    const bool good = ok(r);
    std::string runs;
    for (double t : r.measured.run_seconds) runs += (runs.empty() ? "" : ";") + fmt::format("{:.6f}", t);
    s += fmt::format("{},{},{},{},{},{},{},{},{},{},{:.6f},{},{:.1f},{:.3f},{},{},{}\n",
                     good ? std::to_string(++rank) : std::string(""), r.predicted_rank, L.tp, L.pp, L.vp,
                     L.dp, L.micro_batch, L.sequence_parallel ? 1 : 0, L.recompute_name(),
                     L.distributed_optimizer ? 1 : 0, r.candidate.step_seconds(),
                     good ? fmt::format("{:.6f}", r.measured.step_seconds) : std::string(""),
                     r.measured.peak_mib, r.candidate.memory.terms.total() / kGiB,
                     csv_field(to_string(r.measured.status)), csv_field(r.measured.detail), runs);
  }
  return s;
}

}  // namespace loom::planner
