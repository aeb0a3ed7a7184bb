#include "train/metrics_log.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "runlog/event_file.h"
#include "runlog/progress_line.h"
#include "runlog/record_scalars.h"

namespace loom::train {

MetricsLog::MetricsLog(const std::string& jsonl_path, bool human_output)
    : human_(human_output), tty_(human_output && isatty(STDERR_FILENO)) {
  if (!jsonl_path.empty()) {
    file_ = std::fopen(jsonl_path.c_str(), "a");
    if (!file_) throw std::runtime_error("cannot open metrics file " + jsonl_path + " for appending");
    const std::string dir = std::filesystem::path(jsonl_path).parent_path().string();
    events_ = std::make_unique<runlog::EventFileWriter>(dir.empty() ? "." : dir);
  }
}

MetricsLog::~MetricsLog() {
  end_progress_line();
  if (file_) std::fclose(file_);
}

void MetricsLog::write(const nlohmann::json& record, bool print) {
  if (file_) {
    std::string line = record.dump() + "\n";
    std::fwrite(line.data(), 1, line.size(), file_);
    std::fflush(file_);
  }
  if (events_ && record.contains("step") && record["step"].is_number_integer())
    events_->add_scalars(record["step"].get<int64_t>(), runlog::record_scalars(record));
  tally(record);
  if (print && human_) message(format_metrics_line(record));
}

void MetricsLog::start_session(int64_t step) {
  if (events_) events_->session_start(step);
}

void MetricsLog::tally(const nlohmann::json& r) {
  const std::string kind = r.value("kind", "train");
  const int64_t step = r.value("step", int64_t{-1});
  if (kind == "train") {
    if (first_step_ < 0) first_step_ = step;
    last_step_ = step;
    max_steps_ = r.value("max_steps", max_steps_);
    ++train_records_;
    const double seconds = r.value("step_time_s", 0.0);
    tokens_ += r.value("tokens_per_s", 0.0) * seconds;
    step_seconds_ += seconds;
    elapsed_s_ = r.value("elapsed_s", elapsed_s_);
  } else if (kind == "validation" && r.contains("val_loss") && r["val_loss"].is_number()) {
    const double loss = r["val_loss"].get<double>();
    if (best_val_step_ < 0 || loss < best_val_loss_) {
      best_val_loss_ = loss;
      best_val_step_ = step;
    }
  }
}

void MetricsLog::print_summary() {
  std::string line = "[loom] done: ";
  if (train_records_ > 0) {
    line += fmt::format("steps {}-{} of {} ({} in this run), {:.0f} tokens in {} (mean {:.0f} tokens/s)", first_step_,
                        last_step_, max_steps_, train_records_, tokens_, runlog::format_duration(elapsed_s_),
                        step_seconds_ > 0 ? tokens_ / step_seconds_ : 0.0);
  } else {
    line += "no step trained in this run";
  }
  line += best_val_step_ >= 0 ? fmt::format(" | best validation loss {:.4f} (step {})", best_val_loss_, best_val_step_)
                              : std::string(" | no validation");
  line += " | checkpoint " + (checkpoint_.empty() ? std::string("none saved") : checkpoint_);
  message(line);
}

void MetricsLog::progress(const std::string& text) {
  if (!tty_) return;
  std::fprintf(stderr, "\r\033[K%s", text.c_str());
  std::fflush(stderr);
  progress_shown_ = true;
}

void MetricsLog::message(const std::string& text) {
  if (!human_) return;
  end_progress_line();
  std::fprintf(stderr, "%s\n", text.c_str());
  std::fflush(stderr);
}

void MetricsLog::end_progress_line() {
  if (progress_shown_) {
    std::fprintf(stderr, "\r\033[K");
    progress_shown_ = false;
  }
}

std::string format_metrics_line(const nlohmann::json& r) {
  auto num = [&](const char* key) -> double {
    return r.contains(key) && r[key].is_number() ? r[key].get<double>() : NAN;
  };
  std::string kind = r.value("kind", "train");
  if (kind == "validation") {
    std::string line = fmt::format("step {}/{} | validation loss {:.4f} | ppl {:.2f} | {} batches",
                                   r.value("step", 0), r.value("max_steps", 0), num("val_loss"),
                                   std::exp(num("val_loss")), r.value("val_batches", 0));
    // Prompt learning also scores its answers (ptune/answer_metrics.h).
    if (r.contains("val_accuracy"))
      line += fmt::format(" | exact match {:.1f}% of {}", 100.0 * num("val_accuracy"), r.value("val_examples", 0));
    return line;
  }
  if (kind == "test") {
    return fmt::format("step {} | test loss {:.4f} | exact match {:.1f}% of {}", r.value("step", 0), num("test_loss"),
                       100.0 * num("test_accuracy"), r.value("test_examples", 0));
  }
  std::string line = fmt::format(
      "step {}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.3f} | loss scale {:g} | "
      "{:.0f} ms/step | {:.0f} tokens/s | {:.3f} TFLOP/s/device",
      r.value("step", 0), r.value("max_steps", 0), num("loss"), num("lr"), num("grad_norm"),
      num("loss_scale"), 1000.0 * num("step_time_s"), num("tokens_per_s"),
      num("model_tflops_per_device"));
  if (r.contains("mfu") && r["mfu"].is_number()) line += fmt::format(" | MFU {:.1f}%", 100.0 * num("mfu"));
  if (r.contains("peak_device_memory_mib"))
    line += fmt::format(" | device mem {:.0f} MiB", num("peak_device_memory_mib"));
  if (r.contains("max_rss_mib")) line += fmt::format(" | host mem {:.0f} MiB", num("max_rss_mib"));
  if (r.value("skipped", false)) line += " | step skipped (inf/NaN)";
  if (r.contains("elapsed_s")) line += " | elapsed " + runlog::format_duration(num("elapsed_s"));
  if (r.contains("eta_s")) line += " | ETA " + runlog::format_duration(num("eta_s"));
  if (r.contains("max_time_left_s")) line += " (max_time in " + runlog::format_duration(num("max_time_left_s")) + ")";
  return line;
}

}  // namespace loom::train
