// The TFRecord framing of event files, read back byte by byte (tests/python/test_tensorboard.py
// reads the same files with TensorBoard's own reader), and the record -> tag rule.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "runlog/crc32c.h"
#include "runlog/event_file.h"
#include "runlog/record_scalars.h"

using namespace loom::runlog;

namespace {

uint64_t read_le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

// Splits a TFRecord file into its payloads, checking both CRCs of every record.
std::vector<std::string> read_records(const std::string& bytes) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < bytes.size()) {
    REQUIRE(at + 12 <= bytes.size());
    const uint64_t n = read_le(bytes, at, 8);
    REQUIRE(read_le(bytes, at + 8, 4) == masked_crc32c(bytes.substr(at, 8)));
    REQUIRE(at + 12 + n + 4 <= bytes.size());
    const std::string payload = bytes.substr(at + 12, n);
    REQUIRE(read_le(bytes, at + 12 + n, 4) == masked_crc32c(payload));
    out.push_back(payload);
    at += 12 + n + 4;
  }
  return out;
}

}  // namespace

TEST_CASE("tfrecord_frame lays out length, masked CRCs and payload", "[runlog]") {
  const std::string framed = tfrecord_frame("abc");
  REQUIRE(framed.size() == 8 + 4 + 3 + 4);
  CHECK(read_le(framed, 0, 8) == 3);
  CHECK(read_le(framed, 8, 4) == masked_crc32c(framed.substr(0, 8)));
  CHECK(framed.substr(12, 3) == "abc");
  CHECK(read_le(framed, 15, 4) == masked_crc32c("abc"));
}

TEST_CASE("an event file is named as TensorFlow names it and holds whole records", "[runlog]") {
  char tmpl[] = "/tmp/loom_tb_XXXXXX";
  const std::string dir = std::string(mkdtemp(tmpl)) + "/nested/tb";
  std::string path;
  {
    EventFileWriter writer(dir);
    path = writer.path();
    writer.session_start(1);
    writer.add_scalars(1, {{"train/loss", 2.5}, {"train/lr", 1e-3}});
    writer.add_scalars(2, {});  // nothing: no event
  }
  CHECK_THAT(path, Catch::Matchers::StartsWith(dir + "/events.out.tfevents."));
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto records = read_records(bytes);
  REQUIRE(records.size() == 3);  // version, session start, one summary
  CHECK(records[0].find("brain.Event:2") != std::string::npos);
  CHECK(records[2].find("train/loss") != std::string::npos);
  std::system(("rm -rf " + dir.substr(0, dir.size() - 10)).c_str());
}

TEST_CASE("an unwritable TensorBoard directory is named in the error", "[runlog]") {
  CHECK_THROWS_WITH(EventFileWriter("/proc/loom_no_such/tb"),
                    Catch::Matchers::Contains("/proc/loom_no_such"));
}

TEST_CASE("record_scalars tags every number of a record by its kind", "[runlog]") {
  const auto train = record_scalars(nlohmann::json{
      {"kind", "train"}, {"step", 3}, {"max_steps", 9}, {"loss", 4.0}, {"skipped", false}, {"tokens_per_s", 100}});
  REQUIRE(train.size() == 2);
  CHECK(train[0].tag == "train/loss");
  CHECK(train[0].value == 4.0);
  CHECK(train[1].tag == "train/tokens_per_s");
  const auto val = record_scalars(nlohmann::json{{"kind", "validation"}, {"step", 0}, {"val_loss", 2.0}});
  REQUIRE(val.size() == 2);
  CHECK(val[0].tag == "validation/val_loss");
  CHECK(val[1].tag == "validation/val_perplexity");
  CHECK(std::abs(val[1].value - std::exp(2.0)) < 1e-12);
}

TEST_CASE("eval_result_scalars drops the filter suffix and N/A stderrs", "[runlog]") {
  const auto s = eval_result_scalars(nlohmann::json::parse(
      R"({"results": {"lambada": {"alias": "lambada", "acc,none": 0.5, "acc_stderr,none": 0.1,
                                   "perplexity,none": 9.0, "perplexity_stderr,none": "N/A"}}})"));
  REQUIRE(s.size() == 3);
  CHECK(s[0].tag == "eval/lambada/acc");
  CHECK(s[1].tag == "eval/lambada/acc_stderr");
  CHECK(s[2].tag == "eval/lambada/perplexity");
}

// Not run by ctest (hidden tag): tests/python/test_tensorboard.py runs it with
// LOOM_TB_FIXTURE_DIR set and reads the files back with TensorBoard's EventAccumulator.
TEST_CASE("write the TensorBoard reader fixture", "[.tb_fixture]") {
  const char* dir = std::getenv("LOOM_TB_FIXTURE_DIR");
  REQUIRE(dir != nullptr);
  {
    EventFileWriter first(std::string(dir) + "/run");
    first.session_start(0);
    for (int step = 1; step <= 4; ++step)
      first.add_scalars(step, {{"train/loss", 10.0 / step}, {"train/lr", 1e-3 * step}});
  }
  // A second process resumed from step 2: steps 3 and 4 are logged again with other values.
  EventFileWriter second(std::string(dir) + "/run");
  second.session_start(3);
  for (int step = 3; step <= 5; ++step) second.add_scalars(step, {{"train/loss", 100.0 + step}});
  second.add_scalars(5, {{"validation/val_loss", 2.5}, {"validation/val_perplexity", std::exp(2.5)}});
}
