// Progress lines: durations, ETA, the text, and that non-terminal output has no control
// characters.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "runlog/progress_line.h"

using namespace loom::runlog;

TEST_CASE("format_duration writes m:ss and h:mm:ss", "[runlog]") {
  CHECK(format_duration(0) == "0:00");
  CHECK(format_duration(65.4) == "1:05");
  CHECK(format_duration(3599.6) == "1:00:00");
  CHECK(format_duration(3723) == "1:02:03");
  CHECK(format_duration(NAN) == "--:--");
  CHECK(format_duration(-1) == "--:--");
}

TEST_CASE("eta_seconds extrapolates the rate so far", "[runlog]") {
  CHECK(eta_seconds(25, 100, 10) == 30.0);
  CHECK(eta_seconds(100, 100, 10) == 0.0);
  CHECK(std::isnan(eta_seconds(0, 100, 10)));
}

TEST_CASE("progress_text shows done, total, percent, rate, elapsed and ETA", "[runlog]") {
  CHECK(progress_text("[preprocess]", 12.5, 50, "MB", 1, 5, "10 docs") ==
        "[preprocess] 12.5/50.0 MB (25%) | 2.50 MB/s | elapsed 0:05 | ETA 0:15 | 10 docs");
  CHECK(progress_text("loom eval:", 300, 300, "requests", 0, 20) ==
        "loom eval: 300/300 requests (100%) | 15 requests/s | elapsed 0:20 | ETA 0:00");
}

TEST_CASE("a non-terminal progress line prints plain lines, first and last", "[runlog]") {
  std::FILE* f = std::tmpfile();
  {
    ProgressLine p({"[x]", "items", 0, 3600, f, 0});
    p.update(1, 4);
    p.update(2, 4);  // within plain_every_s: not printed
    p.update(4, 4);
  }
  std::rewind(f);
  std::string text(4096, '\0');
  text.resize(std::fread(text.data(), 1, text.size(), f));
  std::fclose(f);
  CHECK(text.find('\r') == std::string::npos);
  CHECK(text.find('\033') == std::string::npos);
  CHECK_THAT(text, Catch::Matchers::StartsWith("[x] 1/4 items (25%)"));
  CHECK(text.find("[x] 2/4") == std::string::npos);
  CHECK(text.find("[x] 4/4 items (100%)") != std::string::npos);
  CHECK(std::count(text.begin(), text.end(), '\n') == 2);
}

TEST_CASE("a terminal progress line redraws in place and ends with a newline", "[runlog]") {
  std::FILE* f = std::tmpfile();
  {
    ProgressLine p({"[x]", "items", 0, 10, f, 1});
    p.update(1, 2);
    p.update(2, 2);
  }
  std::rewind(f);
  std::string text(4096, '\0');
  text.resize(std::fread(text.data(), 1, text.size(), f));
  std::fclose(f);
  CHECK_THAT(text, Catch::Matchers::StartsWith("\r\033[K[x] 1/2"));
  CHECK_THAT(text, Catch::Matchers::EndsWith("ETA 0:00\n"));
}
