// Training metrics: one JSON object per line in <run dir>/metrics.jsonl, the same records as
// TensorBoard scalars in event files beside it (NeMo's layout: the run directory is the
// TensorBoard log dir; tags by runlog/record_scalars.h, docs/design/tensorboard.md), and the
// human line of rank 0 on stderr (docs/design/conventions.md, "Logs and metrics"): a live
// progress line with ETA when stderr is a terminal, plain lines otherwise, and a one-line
// summary at the end.
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

namespace loom::runlog {
class EventFileWriter;
}

namespace loom::train {

/// Host seconds since `start` (steady clock): a step's, a validation's time for the records.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

class MetricsLog {
 public:
  /// Appends to `jsonl_path` (created if missing; "" = no file, and no event file) and starts a
  /// new TensorBoard event file in its directory. Throws std::runtime_error naming the file
  /// when either cannot be opened.
  MetricsLog(const std::string& jsonl_path, bool human_output);
  ~MetricsLog();

  /// Writes `record` as one JSON line (flushed) and its scalars to the event file at
  /// record["step"] and, when `print` is set, a formatted line built from its fields to stderr.
  void write(const nlohmann::json& record, bool print);
  /// The run (re)starts at `step`: TensorBoard forgets the steps >= `step` that an earlier
  /// process logged (a resume from an older checkpoint redoes them).
  void start_session(int64_t step);
  /// Where the last checkpoint went (for the summary).
  void note_checkpoint(const std::string& path) { checkpoint_ = path; }
  /// "[loom] done: ..." — steps, tokens, mean tokens/s of the train records this process wrote,
  /// the best validation loss and the last checkpoint; printed as a message.
  void print_summary();
  /// A transient progress line (terminal only; overwritten by the next line).
  void progress(const std::string& text);
  /// A plain message on stderr (ends any progress line first).
  void message(const std::string& text);

 private:
  void end_progress_line();
  void tally(const nlohmann::json& record);
  std::FILE* file_ = nullptr;
  std::unique_ptr<runlog::EventFileWriter> events_;
  bool human_;
  bool tty_;
  bool progress_shown_ = false;
  // for the summary
  int64_t first_step_ = -1, last_step_ = -1, max_steps_ = 0, train_records_ = 0;
  double tokens_ = 0, step_seconds_ = 0, best_val_loss_ = 0, elapsed_s_ = 0;
  int64_t best_val_step_ = -1;
  std::string checkpoint_;
};

/// "step 10/300 | loss 5.1234 | lr 1.0e-03 | ... | elapsed 0:12 | ETA 5:48" from a metrics
/// record (elapsed_s, eta_s and max_time_left_s when it has them).
std::string format_metrics_line(const nlohmann::json& record);

}  // namespace loom::train
