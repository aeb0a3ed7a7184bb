#include "data/input_stream.h"

#include <lzma.h>
#include <zlib.h>
#include <zstd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "data/data_error.h"
#include "data/string_suffix.h"

namespace loom::data {
namespace {

constexpr size_t kInChunk = size_t{1} << 20;
constexpr size_t kOutChunk = size_t{4} << 20;

// The compression the first bytes show, if any.
Compression sniff(const unsigned char* p, size_t n) {
  if (n >= 4 && p[0] == 0x28 && p[1] == 0xB5 && p[2] == 0x2F && p[3] == 0xFD) return Compression::kZstd;
  if (n >= 2 && p[0] == 0x1F && p[1] == 0x8B) return Compression::kGzip;
  if (n >= 6 && std::memcmp(p, "\xFD" "7zXZ\0", 6) == 0) return Compression::kXz;
  return Compression::kNone;
}

}  // namespace

const char* compression_name(Compression c) {
  switch (c) {
    case Compression::kNone: return "uncompressed";
    case Compression::kZstd: return "zstd";
    case Compression::kGzip: return "gzip";
    case Compression::kXz: return "xz";
  }
  return "unknown";
}

InputKind input_kind(const std::string& path) {
  InputKind k;
  std::string inner = path;
  for (const auto& [suffix, c] : {std::pair{".zst", Compression::kZstd}, std::pair{".zstd", Compression::kZstd},
                                  std::pair{".gz", Compression::kGzip}, std::pair{".xz", Compression::kXz}}) {
    if (ends_with(path, suffix)) {
      k.compression = c;
      inner = path.substr(0, path.size() - std::strlen(suffix));
      break;
    }
  }
  k.json = ends_with(inner, ".jsonl") || ends_with(inner, ".json");
  return k;
}

// Raw file bytes in, decompressed bytes appended to `out`.
struct LineStream::Decoder {
  std::string path;
  Compression compression;
  std::FILE* file = nullptr;
  std::vector<unsigned char> in;
  size_t in_pos = 0, in_len = 0;
  bool file_eof = false;
  int64_t bytes_in = 0;
  ZSTD_DCtx* zstd = nullptr;
  size_t zstd_last = 0;  // last ZSTD_decompressStream result: 0 = a frame just ended
  z_stream gz{};
  bool gz_open = false, gz_ended = true;
  lzma_stream xz = LZMA_STREAM_INIT;
  bool xz_open = false;

  Decoder(const std::string& p, Compression c) : path(p), compression(c), in(kInChunk) {
    file = std::fopen(p.c_str(), "rb");
    if (!file) throw DataError("input '" + p + "': cannot open: " + std::strerror(errno));
    refill();
    const Compression seen = sniff(in.data(), in_len);
    if (seen != c) {
      std::fclose(file);
      file = nullptr;
      if (c == Compression::kNone)
        throw DataError("input '" + p + "': its extension says uncompressed, but it holds " + compression_name(seen) +
                        " data; name it with its compression suffix (.zst, .gz, .xz)");
      throw DataError("input '" + p + "': its extension says " + compression_name(c) + ", but the file " +
                      (in_len == 0 ? std::string("is empty") : seen == Compression::kNone
                                                                   ? std::string("does not start with the ") + compression_name(c) + " magic bytes"
                                                                   : std::string("holds ") + compression_name(seen) + " data"));
    }
    switch (c) {
      case Compression::kNone: break;
      case Compression::kZstd:
        zstd = ZSTD_createDCtx();
        if (!zstd) throw std::runtime_error("zstd: out of memory");
        break;
      case Compression::kGzip:
        if (inflateInit2(&gz, 15 + 16) != Z_OK) throw std::runtime_error("zlib: inflateInit2 failed");
        gz_open = true;
        gz_ended = false;
        break;
      case Compression::kXz:
        if (lzma_stream_decoder(&xz, UINT64_MAX, LZMA_CONCATENATED) != LZMA_OK)
          throw std::runtime_error("liblzma: cannot create a stream decoder");
        xz_open = true;
        break;
    }
  }
  ~Decoder() {
    if (file) std::fclose(file);
    if (zstd) ZSTD_freeDCtx(zstd);
    if (gz_open) inflateEnd(&gz);
    if (xz_open) lzma_end(&xz);
  }

  void refill() {
    if (in_pos < in_len || file_eof) return;
    in_len = std::fread(in.data(), 1, in.size(), file);
    in_pos = 0;
    bytes_in += static_cast<int64_t>(in_len);
    if (in_len < in.size()) {
      if (std::ferror(file)) throw std::runtime_error("input '" + path + "': read error: " + std::strerror(errno));
      file_eof = true;
    }
  }

  [[noreturn]] void corrupt(const std::string& why) const {
    throw DataError("input '" + path + "': " + compression_name(compression) + " data " + why);
  }

  // Appends up to about kOutChunk decompressed bytes; returns false when the data has ended.
  bool decode(std::string& out) {
    const size_t base = out.size();
    if (compression == Compression::kNone) {
      refill();
      if (in_pos == in_len) return false;
      out.append(reinterpret_cast<const char*>(in.data()) + in_pos, in_len - in_pos);
      in_pos = in_len;
      return true;
    }
    out.resize(base + kOutChunk);
    size_t produced = 0;
    while (produced == 0) {
      refill();
      const bool no_input = in_pos == in_len;
      if (compression == Compression::kZstd) {
        if (no_input) {
          if (zstd_last != 0) corrupt("is truncated (the last frame is incomplete)");
          break;
        }
        ZSTD_inBuffer ib{in.data(), in_len, in_pos};
        ZSTD_outBuffer ob{out.data() + base, kOutChunk, 0};
        zstd_last = ZSTD_decompressStream(zstd, &ob, &ib);
        if (ZSTD_isError(zstd_last)) corrupt(std::string("is corrupt: ") + ZSTD_getErrorName(zstd_last));
        in_pos = ib.pos;
        produced = ob.pos;
      } else if (compression == Compression::kGzip) {
        if (no_input) {
          if (!gz_ended) corrupt("is truncated (the gzip stream does not end)");
          break;
        }
        if (gz_ended) {  // another gzip member follows (concatenated .gz files)
          if (inflateReset(&gz) != Z_OK) throw std::runtime_error("zlib: inflateReset failed");
          gz_ended = false;
        }
        gz.next_in = in.data() + in_pos;
        gz.avail_in = static_cast<uInt>(in_len - in_pos);
        gz.next_out = reinterpret_cast<Bytef*>(out.data() + base);
        gz.avail_out = static_cast<uInt>(kOutChunk);
        const int rc = inflate(&gz, Z_NO_FLUSH);
        if (rc == Z_STREAM_END) gz_ended = true;
        else if (rc != Z_OK && rc != Z_BUF_ERROR) corrupt(std::string("is corrupt: ") + (gz.msg ? gz.msg : "inflate failed"));
        in_pos = in_len - gz.avail_in;
        produced = kOutChunk - gz.avail_out;
      } else {
        xz.next_in = in.data() + in_pos;
        xz.avail_in = in_len - in_pos;
        xz.next_out = reinterpret_cast<uint8_t*>(out.data() + base);
        xz.avail_out = kOutChunk;
        const lzma_ret rc = lzma_code(&xz, no_input ? LZMA_FINISH : LZMA_RUN);
        in_pos = in_len - xz.avail_in;
        produced = kOutChunk - xz.avail_out;
        if (rc == LZMA_STREAM_END) {
          if (produced == 0) break;
        } else if (rc == LZMA_BUF_ERROR && no_input) {
          corrupt("is truncated (the xz stream does not end)");
        } else if (rc != LZMA_OK) {
          corrupt("is corrupt (liblzma error " + std::to_string(static_cast<int>(rc)) + ")");
        }
      }
    }
    out.resize(base + produced);
    return produced > 0;
  }
};

LineStream::LineStream(const std::string& path, int64_t max_line_bytes, std::string limit_source)
    : path_(path),
      decoder_(std::make_unique<Decoder>(path, input_kind(path).compression)),
      max_line_bytes_(max_line_bytes),
      limit_source_(std::move(limit_source)) {}

LineStream::~LineStream() = default;

int64_t LineStream::bytes_in() const { return decoder_->bytes_in; }

bool LineStream::fill() {
  if (eof_) return false;
  if (pos_ > 0) {
    buffer_.erase(0, pos_);
    pos_ = 0;
  }
  try {
    if (!decoder_->decode(buffer_)) eof_ = true;
  } catch (const DataError& e) {
    throw DataError(std::string(e.what()) + " (after line " + std::to_string(line_number_) + ")");
  }
  return !eof_;
}

bool LineStream::next_line(std::string& line) {
  auto refuse_if_longer = [&](size_t length) {
    if (static_cast<int64_t>(length) > max_line_bytes_)
      throw DataError("'" + path_ + "' line " + std::to_string(line_number_ + 1) + ": longer than " +
                      std::to_string(max_line_bytes_) + " bytes without a newline (" + limit_source_ + ")");
  };
  size_t searched = pos_;
  for (;;) {
    const size_t nl = buffer_.find('\n', searched);
    if (nl != std::string::npos) {
      refuse_if_longer(nl - pos_);
      line.assign(buffer_, pos_, nl - pos_);
      bytes_out_ += static_cast<int64_t>(nl - pos_ + 1);
      pos_ = nl + 1;
      ++line_number_;
      return true;
    }
    searched = buffer_.size() - pos_;  // offset after fill() moves the data to the front
    refuse_if_longer(searched);
    if (!fill()) break;
  }
  if (pos_ >= buffer_.size()) return false;
  refuse_if_longer(buffer_.size() - pos_);
  line.assign(buffer_, pos_, std::string::npos);
  bytes_out_ += static_cast<int64_t>(buffer_.size() - pos_);
  pos_ = buffer_.size();
  ++line_number_;
  return true;
}

}  // namespace loom::data
