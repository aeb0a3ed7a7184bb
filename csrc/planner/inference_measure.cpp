#include "planner/inference_measure.h"

#include <cmath>
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "launch/local_launcher.h"
#include "rules/model_shape_json.h"
#include "planner/text_io.h"

namespace loom::planner {
namespace {

namespace fs = std::filesystem;

// "+12.3%", or "-" when either value is missing.
std::string percent(double measured, double predicted, bool ok) {
  if (!ok || predicted <= 0) return "-";
  return fmt::format("{:+.0f}%", 100 * relative_error(measured, predicted));
}

}  // namespace

ModelShape checkpoint_model_shape(const std::string& checkpoint) {
  const fs::path dir = fs::is_directory(fs::path(checkpoint) / "checkpoints") ? fs::path(checkpoint) / "checkpoints"
                                                                              : fs::path(checkpoint);
  const std::string tracker = (dir / "latest_checkpointed_iteration.txt").string();
  if (!fs::is_regular_file(tracker))
    throw std::invalid_argument(fmt::format("--checkpoint {}: no {} (expected a Loom run or checkpoints directory)",
                                            checkpoint, tracker));
  const std::string text = read_text(tracker, "--checkpoint");
  long long iteration = -1;
  try {
    iteration = std::stoll(text);
  } catch (const std::exception&) {
  }
  if (iteration < 0) throw std::invalid_argument(fmt::format("--checkpoint: {} holds no iteration number", tracker));
  const std::string file = (dir / fmt::format("iter_{:07d}", iteration) / "metadata.json").string();
  const auto meta = nlohmann::json::parse(read_text(file, "--checkpoint"), nullptr, false);
  if (meta.is_discarded() || !meta.is_object() || !meta.contains("layout") || !meta["layout"].is_object())
    throw std::invalid_argument(fmt::format("--checkpoint: {} is not a checkpoint's metadata (no layout object)", file));
  ModelShape s;
  try {
    s = model_shape_from_json(meta["layout"].value("model", nlohmann::json::object()), file);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("--checkpoint: {} (expected a Loom checkpoint)", e.what()));
  }
  s.validate();
  return s;
}

InferenceMeasurement measure_inference_layout(const InferenceMeasureOptions& opt, const InferenceLayout& layout,
                                              std::size_t rank) {
  InferenceMeasurement out;
  const std::string result_file = fmt::format("{}/layout-{}.json", opt.work_dir, rank);
  std::error_code ec;
  fs::create_directories(opt.work_dir, ec);
  fs::remove(result_file, ec);

  launch::LaunchOptions lo;
  lo.argv = {opt.loom_exe, "serve", "--checkpoint", opt.checkpoint,
             "--tensor-parallel", std::to_string(layout.parallel.tp), "--pipeline-parallel", std::to_string(layout.parallel.pp),
             "--max-batch", std::to_string(layout.batch), "--bench-batch", std::to_string(layout.batch),
             "--bench-prompt-tokens", std::to_string(opt.prompt_tokens),
             // The whole batch's prompts in one step's forward, as the TTFT model assumes
             // (docs/planner_inference.md); the server's default budget would chunk them.
             "--max-num-batched-tokens", std::to_string(std::max<int64_t>(layout.batch * opt.prompt_tokens, layout.batch)),
             "--bench-output-tokens", std::to_string(opt.output_tokens),
             "--bench-rounds", std::to_string(opt.rounds), "--bench-out", result_file};
  lo.nproc = layout.parallel.tp * layout.parallel.pp;
  lo.timeout_s = opt.timeout_s;
  lo.grace_s = 5;
  lo.capture_output = true;
  lo.echo_output = false;
  launch::LaunchResult result;
  try {
    result = launch::launch_local(lo);
  } catch (const std::exception& e) {
    out.detail = e.what();
    return out;
  }
  const LaunchOutcome outcome = judge_launch(result, opt.timeout_s);
  out.peak_mib = outcome.peak_rss_mib;
  out.wall_seconds = outcome.wall_seconds;
  out.status = outcome.status;
  out.detail = outcome.detail;
  if (out.status != RunStatus::ok) return out;
  const auto doc = fs::is_regular_file(result_file) ? nlohmann::json::parse(read_text(result_file), nullptr, false)
                                                    : nlohmann::json();
  if (!doc.is_object() || !doc.contains("tokens_per_s") || !doc["tokens_per_s"].is_number()) {
    out.status = RunStatus::error;
    out.detail = fmt::format("the run succeeded but wrote no measurement to {}", result_file);
    return out;
  }
  out.ttft_ms = doc.value("ttft_ms", 0.0);
  out.token_ms = doc.value("token_ms", 0.0);
  out.request_ms = doc.value("request_ms", 0.0);
  out.tokens_per_s = doc.value("tokens_per_s", 0.0);
  return out;
}

double relative_error(double measured, double predicted) {
  return predicted != 0 ? (measured - predicted) / predicted : 0.0;
}

std::string format_inference_measured_table(const std::vector<MeasuredInferenceLayout>& rows) {
  std::string s = fmt::format("{:>4} {:>3} {:>3} {:>5}  {:>30}  {:>30}  {:>30}  {}\n", "rank", "TP", "PP", "batch",
                              "TTFT ms (pred / meas / err)", "token ms (pred / meas / err)",
                              "tokens/s (pred / meas / err)", "status");
  double err[3] = {0, 0, 0};
  int ok_rows = 0;
  for (const auto& r : rows) {
    const InferenceLayout& L = r.candidate.layout;
    const InferenceTime& t = r.candidate.time;
    const InferenceMeasurement& m = r.measured;
    const bool ok = m.status == RunStatus::ok;
    // "predicted / measured / error" with `digits` decimals.
    auto cell = [&](double predicted, double measured, int digits) {
      return fmt::format("{:>9.{}f} / {:>9} / {:>6}", predicted, digits,
                         ok ? fmt::format("{:.{}f}", measured, digits) : std::string("-"),
                         percent(measured, predicted, ok));
    };
    s += fmt::format("{:>4} {:>3} {:>3} {:>5}  {:>30}  {:>30}  {:>30}  {}\n", r.predicted_rank, L.parallel.tp, L.parallel.pp, L.batch,
                     cell(t.ttft * 1e3, m.ttft_ms, 2), cell(t.per_token * 1e3, m.token_ms, 2),
                     cell(t.tokens_per_s_replica, m.tokens_per_s, 1),
                     ok ? std::string("ok") : fmt::format("{}: {}", to_string(m.status), m.detail));
    if (ok) {
      ++ok_rows;
      err[0] += std::abs(relative_error(m.ttft_ms, t.ttft * 1e3));
      err[1] += std::abs(relative_error(m.token_ms, t.per_token * 1e3));
      err[2] += std::abs(relative_error(m.tokens_per_s, t.tokens_per_s_replica));
    }
  }
  if (ok_rows > 0)
    s += fmt::format("mean absolute error over {} measured layouts: TTFT {:.0f}%, per token {:.0f}%, tokens/s {:.0f}%\n",
                     ok_rows, 100 * err[0] / ok_rows, 100 * err[1] / ok_rows, 100 * err[2] / ok_rows);
  else
    s += "no measured run succeeded (see the status column)\n";
  return s;
}

std::string format_inference_measured_csv(const std::vector<MeasuredInferenceLayout>& rows) {
  std::string s =
      "predicted_rank,tp,pp,batch,predicted_ttft_ms,measured_ttft_ms,ttft_error,predicted_token_ms,"
      "measured_token_ms,token_error,predicted_tokens_per_s,measured_tokens_per_s,tokens_per_s_error,"
      "measured_request_ms,peak_mib,status,detail\n";
  for (const auto& r : rows) {
    const InferenceLayout& L = r.candidate.layout;
    const InferenceTime& t = r.candidate.time;
    const InferenceMeasurement& m = r.measured;
    s += fmt::format("{},{},{},{},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.1f},{},{}\n",
                     r.predicted_rank, L.parallel.tp, L.parallel.pp, L.batch, t.ttft * 1e3, m.ttft_ms,
                     relative_error(m.ttft_ms, t.ttft * 1e3), t.per_token * 1e3, m.token_ms,
                     relative_error(m.token_ms, t.per_token * 1e3), t.tokens_per_s_replica, m.tokens_per_s,
                     relative_error(m.tokens_per_s, t.tokens_per_s_replica), m.request_ms, m.peak_mib,
                     to_string(m.status), csv_field(m.detail));
  }
  return s;
}

}  // namespace loom::planner
