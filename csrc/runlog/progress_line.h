// Progress lines for long runs (`loom train`'s step line, `loom preprocess`, `loom eval`):
// how far, how fast, how long so far and how long still to go. On a terminal the line is
// rewritten in place; anywhere else (CI, Slurm logs, pipes) plain lines are printed now and
// then, with no carriage returns or escape sequences (docs/design/conventions.md, "Logs").
#pragma once
#include <chrono>
#include <cstdio>
#include <string>

namespace loom::runlog {

/// "4:05" under an hour, "1:02:03" from an hour on; "--:--" when unknown (NaN, infinite,
/// negative).
std::string format_duration(double seconds);

/// Seconds still to go at a constant rate: (total - done) × elapsed / done; NaN before any
/// progress.
double eta_seconds(double done, double total, double elapsed_s);

/// "<label> 12.5/40.0 MB (31%) | 2.10 MB/s | elapsed 0:06 | ETA 0:13[ | detail]": `done` and
/// `total` are in `unit` (shown with `decimals` decimals); rate = done / elapsed.
std::string progress_text(const std::string& label, double done, double total, const std::string& unit,
                          int decimals, double elapsed_s, const std::string& detail = "");

/// One operation's progress on a stream (stderr by default).
class ProgressLine {
 public:
  struct Options {
    std::string label;          ///< e.g. "[preprocess]", "loom eval:"
    std::string unit;           ///< e.g. "MB", "requests"
    int decimals = 0;           ///< of done/total
    double plain_every_s = 10;  ///< non-terminal: at most one line per this many seconds
    std::FILE* out = stderr;
    int terminal = -1;          ///< 1 / 0; -1: isatty(out)
  };
  explicit ProgressLine(Options options);
  ~ProgressLine();

  /// Shows `done` of `total`. Terminal: redraws at most 10 times a second (always when done ==
  /// total). Elsewhere: a plain line when plain_every_s passed since the last one, at the first
  /// update and when done == total.
  void update(double done, double total, const std::string& detail = "");
  /// Ends a terminal line (newline) so that other output starts on its own line; nothing
  /// elsewhere.
  void end_line();
  double elapsed_s() const;

 private:
  Options o_;
  bool terminal_;
  bool shown_ = false;  ///< a terminal line is on screen without its newline
  double last_print_ = -1e9;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace loom::runlog
