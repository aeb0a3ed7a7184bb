// TensorBoard event files: what TensorFlow's EventsWriter and torch.utils.tensorboard write, so
// that `tensorboard --logdir` and its EventAccumulator read them (docs/design/tensorboard.md).
// A file is a sequence of TFRecords (little-endian u64 length, masked CRC-32C of the length, the
// bytes, masked CRC-32C of the bytes), each holding one serialized tensorboard.Event
// (third_party/tensorboard_proto/.../event.proto); the first Event names the file version.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace loom::runlog {

/// One scalar of a step: `tag` is TensorBoard's series name ("train/loss").
struct Scalar {
  std::string tag;
  double value;
};

/// The TFRecord framing of one record (length, masked CRC of the length, `payload`, masked CRC
/// of `payload`).
std::string tfrecord_frame(std::string_view payload);

/// Appends events to a new file <dir>/events.out.tfevents.<unix seconds>.<host>.<pid>.<n> (the
/// name TensorFlow gives it; TensorBoard reads a directory's files in name order). Each call
/// writes whole records and flushes, so a run killed at any point leaves a readable file.
class EventFileWriter {
 public:
  /// Creates `dir` if missing and the file, writing its "brain.Event:2" version event. Throws
  /// std::runtime_error naming the file when it cannot be created.
  explicit EventFileWriter(const std::string& dir);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  /// One Event at `step` whose Summary holds every scalar (as simple_value: float32, what
  /// TensorBoard's scalar dashboard and torch's add_scalar use). Throws std::runtime_error
  /// naming the file when the write fails.
  void add_scalars(int64_t step, const std::vector<Scalar>& scalars);
  /// A SessionLog START event at `step`: TensorBoard discards the events of steps >= `step`
  /// read before it, so a run resumed from an earlier checkpoint does not show the steps it
  /// redoes twice.
  void session_start(int64_t step);
  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& serialized_event);
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace loom::runlog
