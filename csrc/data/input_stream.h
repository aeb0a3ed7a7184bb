// Streams the bytes of one corpus file, decompressing `.zst`, `.gz` and `.xz` on the fly
// (libzstd, zlib, liblzma), and splits them into lines. The compression is named by the file's
// extension and must agree with the file's first bytes (docs/design/corpus_inputs.md).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace loom::data {

enum class Compression { kNone, kZstd, kGzip, kXz };
const char* compression_name(Compression c);

/// What a file holds, from its name: the compression suffix (.zst/.zstd, .gz, .xz) and, under
/// it, whether the documents are JSON lines (.jsonl, .json) or plain text (anything else).
struct InputKind {
  Compression compression = Compression::kNone;
  bool json = false;
};
InputKind input_kind(const std::string& path);

/// The longest line (decompressed bytes, without its "\n") a LineStream holds before it refuses
/// the file: a line is held whole in memory, and a stream without newlines (/dev/zero, a binary
/// file) would otherwise grow until memory runs out (`loom preprocess --max-line-bytes`).
constexpr int64_t kDefaultMaxLineBytes = int64_t{1} << 30;

/// The longest line of a JSON-lines file of examples (`loom ptune`'s datasets, `loom eval`'s
/// tasks), where a line is one record: 64 MiB, far above any prompt a model can take, so that a
/// damaged or hostile file is refused before it costs gigabytes (docs/design/hardening.md).
constexpr int64_t kMaxRecordLineBytes = int64_t{64} << 20;

/// Sequential reader of one file's decompressed bytes, line by line.
class LineStream {
 public:
  /// Opens `path` and checks its first bytes against its extension: a `.zst` that is not zstd
  /// data, or a `.jsonl` that is gzip data, throws DataError naming the file and what each says.
  /// A missing or unreadable file throws DataError.
  /// `limit_source` names where max_line_bytes comes from in the error of a longer line.
  explicit LineStream(const std::string& path, int64_t max_line_bytes = kDefaultMaxLineBytes,
                      std::string limit_source = "--max-line-bytes");
  ~LineStream();
  LineStream(const LineStream&) = delete;
  LineStream& operator=(const LineStream&) = delete;

  /// Next line without its "\n" (a final line without one counts); false at the end. A
  /// truncated or corrupt compressed stream throws DataError naming the file, the compression
  /// and the line reached, a line longer than max_line_bytes throws DataError naming the file
  /// and line (having read at most max_line_bytes plus one read chunk of it); an I/O error
  /// throws std::runtime_error.
  bool next_line(std::string& line);
  /// Lines returned so far (the number of the last one).
  int64_t line_number() const { return line_number_; }
  /// Decompressed bytes consumed so far, newlines included.
  int64_t bytes_out() const { return bytes_out_; }
  /// Bytes read from the file so far (compressed size for compressed files).
  int64_t bytes_in() const;
  const std::string& path() const { return path_; }

 private:
  bool fill();  // appends decompressed bytes to buffer_; false at the end of the data

  struct Decoder;
  std::string path_;
  std::unique_ptr<Decoder> decoder_;
  std::string buffer_;
  size_t pos_ = 0;
  bool eof_ = false;
  int64_t max_line_bytes_;
  std::string limit_source_;
  int64_t line_number_ = 0, bytes_out_ = 0;
};

}  // namespace loom::data
