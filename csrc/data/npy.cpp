#include "data/npy.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>

#include "data/data_error.h"

namespace loom::data {
namespace {

size_t descr_size(const std::string& d) {
  if (d == "<i2" || d == "<u2") return 2;
  if (d == "<i4" || d == "<u4") return 4;
  if (d == "<i8" || d == "<u8") return 8;
  return 0;
}

using Bad = std::function<DataError(const std::string&)>;

// The header dict's text and where the data starts (format versions 1, 2 and 3).
std::pair<std::string, size_t> npy_header(const std::string& bytes, const Bad& bad) {
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) throw bad("bad magic, not a NumPy .npy file");
  const int major = static_cast<uint8_t>(bytes[6]);
  size_t header_len, header_start;
  if (major == 1) {
    header_len = static_cast<uint8_t>(bytes[8]) | (static_cast<size_t>(static_cast<uint8_t>(bytes[9])) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) throw bad("truncated header");
    uint32_t l;
    std::memcpy(&l, bytes.data() + 8, 4);
    header_len = l;
    header_start = 12;
  } else {
    throw bad("unsupported format version " + std::to_string(major));
  }
  if (bytes.size() < header_start + header_len) throw bad("truncated header");
  return {bytes.substr(header_start, header_len), header_start + header_len};
}

// Fills arr.descr and arr.shape from the header dict; returns the element count.
size_t parse_header(const std::string& header, NpyArray& arr, const Bad& bad) {
  // Position just after "'key':" in the header dict.
  auto field = [&](const std::string& key) {
    const auto k = header.find("'" + key + "'");
    const auto colon = k == std::string::npos ? k : header.find(':', k);
    if (colon == std::string::npos) throw bad("header lacks '" + key + "'");
    return colon + 1;
  };
  const size_t descr_open = header.find('\'', field("descr"));
  const size_t descr_close = descr_open == std::string::npos ? descr_open : header.find('\'', descr_open + 1);
  if (descr_close == std::string::npos) throw bad("header's 'descr' is not a quoted string");
  arr.descr = header.substr(descr_open + 1, descr_close - descr_open - 1);
  if (arr.descr == "|i1" || arr.descr == "|u1") throw bad("1-byte dtypes are not supported");
  if (descr_size(arr.descr) == 0) throw bad("unsupported dtype '" + arr.descr + "', expected a little-endian integer type");
  if (header.find("True", field("fortran_order")) == header.find_first_not_of(' ', field("fortran_order")))
    throw bad("Fortran order is not supported");
  const size_t shape_open = header.find('(', field("shape"));
  const size_t shape_close = shape_open == std::string::npos ? shape_open : header.find(')', shape_open);
  if (shape_close == std::string::npos) throw bad("header's 'shape' is not a tuple");
  const std::string shape = header.substr(shape_open + 1, shape_close - shape_open - 1);
  std::stringstream sh(shape);
  std::string item;
  size_t count = 1;
  while (std::getline(sh, item, ',')) {
    const size_t first = item.find_first_not_of(' ');
    if (first == std::string::npos) continue;
    const size_t last = item.find_last_not_of(' ');
    const std::string digits = item.substr(first, last - first + 1);
    if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos)
      throw bad("shape (" + shape + ") holds '" + digits + "', expected a size");
    arr.shape.push_back(std::stoull(digits));
    if (__builtin_mul_overflow(count, arr.shape.back(), &count)) throw bad("shape (" + shape + ") overflows");
  }
  if (arr.shape.empty() || arr.shape.size() > 2) throw bad("expected a 1-D or 2-D array, shape (" + shape + ")");
  return count;
}

// The `count` little-endian integers of `descr` at `src`, widened to int64.
std::vector<int64_t> decode_values(const char* src, size_t count, const std::string& descr) {
  const size_t es = descr_size(descr);
  const bool is_unsigned = descr[1] == 'u';
  std::vector<int64_t> out(count);
  for (size_t i = 0; i < count; ++i) {
    const char* s = src + i * es;
    int64_t v = 0;
    if (es == 2) { if (is_unsigned) { uint16_t x; std::memcpy(&x, s, 2); v = x; } else { int16_t x; std::memcpy(&x, s, 2); v = x; } }
    else if (es == 4) { if (is_unsigned) { uint32_t x; std::memcpy(&x, s, 4); v = x; } else { int32_t x; std::memcpy(&x, s, 4); v = x; } }
    else { std::memcpy(&v, s, 8); }
    out[i] = v;
  }
  return out;
}

}  // namespace

NpyArray read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open .npy file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  const Bad bad = [&](const std::string& what) { return DataError(".npy file '" + path + "': " + what); };
  const auto [header, data_start] = npy_header(bytes, bad);
  NpyArray arr;
  const size_t count = parse_header(header, arr, bad);
  const size_t es = descr_size(arr.descr);
  size_t data_bytes = 0;
  if (__builtin_mul_overflow(count, es, &data_bytes) || bytes.size() - data_start < data_bytes)
    throw bad("truncated: " + std::to_string(count) + " elements of " + arr.descr + " need " +
              std::to_string(count * es) + " bytes, the file has " + std::to_string(bytes.size() - data_start));
  // NumPy writes exactly the data: extra bytes mean the header's dtype or shape was changed.
  if (bytes.size() - data_start != data_bytes)
    throw bad(std::to_string(bytes.size() - data_start - data_bytes) + " bytes after the " + std::to_string(count) +
              " elements of " + arr.descr + ": the header's dtype or shape disagree with the file size");
  arr.data = decode_values(bytes.data() + data_start, count, arr.descr);
  return arr;
}

void write_npy(const std::string& path, const std::vector<int64_t>& values, const std::vector<size_t>& shape,
               const std::string& descr) {
  const size_t es = descr_size(descr);
  if (es == 0 || descr[1] != 'i') throw std::invalid_argument("write_npy: unsupported descr '" + descr + "'");
  std::string dims;
  for (size_t s : shape) dims += std::to_string(s) + ", ";
  if (shape.size() > 1) dims.resize(dims.size() - 2);
  else if (shape.size() == 1) dims.pop_back();  // "(N,)"
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xFF);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  const size_t base = out.size();
  out.resize(base + values.size() * es);
  for (size_t i = 0; i < values.size(); ++i) {
    const int64_t v = values[i];
    char* d = out.data() + base + i * es;
    if (es == 2) { auto x = static_cast<int16_t>(v); std::memcpy(d, &x, 2); }
    else if (es == 4) { auto x = static_cast<int32_t>(v); std::memcpy(d, &x, 4); }
    else std::memcpy(d, &v, 8);
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw std::runtime_error("cannot create '" + tmp + "': " + std::strerror(errno));
  const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  if (std::fclose(f) != 0 || !ok) throw std::runtime_error("cannot write '" + tmp + "'");
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw std::runtime_error("cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(errno));
}

}  // namespace loom::data
