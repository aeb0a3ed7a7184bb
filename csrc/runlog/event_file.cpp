#include "runlog/event_file.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "runlog/crc32c.h"
#include "tensorboard/compat/proto/event.pb.h"

namespace loom::runlog {
namespace {

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

void append_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFFu));
}

// mkdir -p (std::filesystem's create_directories is avoided in torch-linked binaries:
// docs/architecture.md, the libtorch ABI clash).
void make_directories(const std::string& dir) {
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string part = dir.substr(0, pos);
    if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST)
      throw std::runtime_error(fmt::format("cannot create the TensorBoard directory {}: {}", part, std::strerror(errno)));
  }
}

}  // namespace

std::string tfrecord_frame(std::string_view payload) {
  std::string out;
  out.reserve(payload.size() + 16);
  append_le(out, payload.size(), 8);
  const uint32_t length_crc = masked_crc32c(std::string_view(out.data(), 8));
  append_le(out, length_crc, 4);
  out.append(payload.data(), payload.size());
  append_le(out, masked_crc32c(payload), 4);
  return out;
}

EventFileWriter::EventFileWriter(const std::string& dir) {
  static std::atomic<int> files_made{0};
  make_directories(dir);
  const double now = unix_seconds();
  path_ = fmt::format("{}/events.out.tfevents.{:010d}.{}.{}.{}", dir, static_cast<int64_t>(now), host_name(),
                      static_cast<long>(::getpid()), files_made++);
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) throw std::runtime_error(fmt::format("cannot create the TensorBoard event file {}: {}", path_, std::strerror(errno)));
  tensorboard::Event event;
  event.set_wall_time(now);
  event.set_file_version("brain.Event:2");
  event.mutable_source_metadata()->set_writer("loom");
  write_event(event.SerializeAsString());
}

EventFileWriter::~EventFileWriter() {
  if (file_) std::fclose(file_);
}

void EventFileWriter::add_scalars(int64_t step, const std::vector<Scalar>& scalars) {
  if (scalars.empty()) return;
  tensorboard::Event event;
  event.set_wall_time(unix_seconds());
  event.set_step(step);
  for (const auto& s : scalars) {
    auto* value = event.mutable_summary()->add_value();
    value->set_tag(s.tag);
    value->set_simple_value(static_cast<float>(s.value));
  }
  write_event(event.SerializeAsString());
}

void EventFileWriter::session_start(int64_t step) {
  tensorboard::Event event;
  event.set_wall_time(unix_seconds());
  event.set_step(step);
  event.mutable_session_log()->set_status(tensorboard::SessionLog::START);
  write_event(event.SerializeAsString());
}

void EventFileWriter::write_event(const std::string& serialized_event) {
  const std::string record = tfrecord_frame(serialized_event);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() || std::fflush(file_) != 0)
    throw std::runtime_error(fmt::format("writing the TensorBoard event file {} failed: {}", path_, std::strerror(errno)));
}

}  // namespace loom::runlog
