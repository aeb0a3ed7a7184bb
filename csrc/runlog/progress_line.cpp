#include "runlog/progress_line.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>

namespace loom::runlog {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  if (s >= 3600) return fmt::format("{}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60);
  return fmt::format("{}:{:02d}", s / 60, s % 60);
}

double eta_seconds(double done, double total, double elapsed_s) {
  if (!(done > 0) || !(elapsed_s >= 0)) return NAN;
  return std::max(0.0, total - done) * elapsed_s / done;
}

std::string progress_text(const std::string& label, double done, double total, const std::string& unit,
                          int decimals, double elapsed_s, const std::string& detail) {
  const double pct = total > 0 ? 100.0 * done / total : 100.0;
  const double rate = elapsed_s > 0 ? done / elapsed_s : NAN;
  std::string text = fmt::format("{} {:.{}f}/{:.{}f} {} ({:.0f}%) | ", label, done, decimals, total, decimals, unit, pct);
  text += std::isfinite(rate) ? fmt::format("{:.{}f} {}/s", rate, rate < 10 ? 2 : 0, unit) : fmt::format("- {}/s", unit);
  text += fmt::format(" | elapsed {} | ETA {}", format_duration(elapsed_s),
                      format_duration(eta_seconds(done, total, elapsed_s)));
  if (!detail.empty()) text += " | " + detail;
  return text;
}

ProgressLine::ProgressLine(Options options)
    : o_(std::move(options)), terminal_(o_.terminal >= 0 ? o_.terminal == 1 : ::isatty(fileno(o_.out)) == 1) {}

ProgressLine::~ProgressLine() { end_line(); }

double ProgressLine::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void ProgressLine::update(double done, double total, const std::string& detail) {
  const double now = elapsed_s();
  const bool last = done >= total;
  const double every = terminal_ ? 0.1 : o_.plain_every_s;
  if (!last && now - last_print_ < every) return;
  last_print_ = now;
  const std::string text = progress_text(o_.label, done, total, o_.unit, o_.decimals, now, detail);
  if (terminal_) {
    std::fprintf(o_.out, "\r\033[K%s", text.c_str());
    shown_ = true;
    if (last) end_line();
  } else {
    std::fprintf(o_.out, "%s\n", text.c_str());
  }
  std::fflush(o_.out);
}

void ProgressLine::end_line() {
  if (!shown_) return;
  std::fprintf(o_.out, "\n");
  std::fflush(o_.out);
  shown_ = false;
}

}  // namespace loom::runlog
