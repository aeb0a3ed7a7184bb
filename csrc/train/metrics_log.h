// Training metrics: one JSON object per line in <run dir>/metrics.jsonl, and the human line of
// rank 0 on stderr (docs/design/conventions.md, "Logs and metrics"): a live progress line with ETA when
// stderr is a terminal, plain lines otherwise.
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <cstdio>
#include <memory>
#include <string>

namespace loom::train {

class MetricsLog {
 public:
  /// Appends to `jsonl_path` (created if missing; "" = no file). Throws std::runtime_error
  /// naming the file when it cannot be opened.
  MetricsLog(const std::string& jsonl_path, bool human_output);
  ~MetricsLog();

  /// Writes `record` as one JSON line (flushed) and, when `print` is set, a formatted line
  /// built from its fields to stderr.
  void write(const nlohmann::json& record, bool print);
  /// A transient progress line (terminal only; overwritten by the next line).
  void progress(const std::string& text);
  /// A plain message on stderr (ends any progress line first).
  void message(const std::string& text);

 private:
  void end_progress_line();
  std::FILE* file_ = nullptr;
  bool human_;
  bool tty_;
  bool progress_shown_ = false;
};

/// "step 10/300 | loss 5.1234 | lr 1.0e-03 | ..." from a metrics record.
std::string format_metrics_line(const nlohmann::json& record);

}  // namespace loom::train
