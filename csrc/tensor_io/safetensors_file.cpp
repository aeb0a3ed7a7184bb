#include "tensor_io/safetensors_file.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <vector>

namespace fs = std::filesystem;

namespace loom::tensor_io {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference reader's limit

void put_u64_le(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

struct DtypeName {
  const char* name;
  at::ScalarType type;
};
// The reference's dtype names of the tensor types Loom reads and writes.
constexpr DtypeName kDtypes[] = {{"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},
                                 {"BF16", at::kBFloat16}, {"I64", at::kLong}, {"I32", at::kInt}};
constexpr const char* kDtypeList = "F64, F32, F16, BF16, I64 or I32";

const char* dtype_name(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.name;
  return nullptr;
}

bool dtype_of(const std::string& name, at::ScalarType& out) {
  for (const auto& d : kDtypes)
    if (name == d.name) {
      out = d.type;
      return true;
    }
  return false;
}

}  // namespace

void write_safetensors(const std::string& path, const SafetensorsContent& content) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!content.metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : content.metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  std::vector<at::Tensor> data;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : content.tensors) {
    const char* dtype = dtype_name(tensor.scalar_type());
    if (!dtype)
      throw std::invalid_argument(fmt::format("{}: tensor '{}' is {}; safetensors files hold {}", path, name,
                                              c10::toString(tensor.scalar_type()), kDtypeList));
    // host: a file's bytes come from host memory.
    at::Tensor host = tensor.detach().to(at::kCPU).contiguous();
    const uint64_t bytes = host.nbytes();
    nlohmann::ordered_json entry;
    entry["dtype"] = dtype;
    entry["shape"] = host.sizes().vec();
    entry["data_offsets"] = {offset, offset + bytes};
    header[name] = entry;
    offset += bytes;
    data.push_back(host);
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out;
  put_u64_le(out, json.size());
  out += json;
  const fs::path tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(out.data(), static_cast<std::streamsize>(out.size()));
    for (const auto& t : data) f.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
    f.flush();
    if (!f) throw std::runtime_error(fmt::format("{}: cannot write the file", tmp.string()));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw std::runtime_error(fmt::format("{}: cannot rename into place: {}", path, ec.message()));
}

SafetensorsContent read_safetensors(const std::string& path) {
  auto bad = [&](const std::string& why) { return std::invalid_argument(path + ": not a safetensors file: " + why); };
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw std::invalid_argument(path + ": cannot open the file");
  const uint64_t size = static_cast<uint64_t>(f.tellg());
  f.seekg(0);
  if (size < 8) throw bad(fmt::format("{} bytes, shorter than the 8-byte header length", size));
  unsigned char len_bytes[8];
  f.read(reinterpret_cast<char*>(len_bytes), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n > kMaxHeaderBytes || n > size - 8) throw bad(fmt::format("header length {} beyond the file ({} bytes)", n, size));
  std::string json(n, '\0');
  f.read(json.data(), static_cast<std::streamsize>(n));
  // The format forbids a name twice, and a field twice in an entry (the reference reader's
  // struct refuses it; __metadata__ is a free map there, the last value kept); a JSON object
  // parser would keep one of the two silently.
  using Event = nlohmann::json::parse_event_t;
  std::vector<std::set<std::string>> open_objects;  // keys seen in each open object
  std::vector<bool> checked;                        // false for __metadata__
  std::string top_key, duplicate;
  auto refuse_duplicates = [&](int /*depth*/, Event event, nlohmann::json& parsed) {
    if (event == Event::object_start) {
      checked.push_back(!(open_objects.size() == 1 && top_key == "__metadata__"));
      open_objects.emplace_back();
    } else if (event == Event::object_end) {
      open_objects.pop_back();
      checked.pop_back();
    } else if (event == Event::key && !open_objects.empty()) {
      const std::string key = parsed.get<std::string>();
      const bool top = open_objects.size() == 1;
      if (top) top_key = key;
      if (checked.back() && !open_objects.back().insert(key).second && duplicate.empty())
        duplicate = top ? "the header names '" + key + "' twice"
                        : "the header's entry '" + top_key + "' has the field '" + key + "' twice";
    }
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(json, refuse_duplicates);
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("header is not JSON: ") + e.what());
  }
  if (!duplicate.empty()) throw bad(duplicate + " (each name and field once, says the format)");
  if (!header.is_object()) throw bad("header is not a JSON object");
  const uint64_t data_bytes = size - 8 - n;
  SafetensorsContent out;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) throw bad("__metadata__ is not an object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) throw bad("__metadata__ value of '" + k + "' is not a string");
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
      throw bad("tensor '" + name + "' lacks dtype, shape or data_offsets");
    at::ScalarType dtype = at::kFloat;
    if (!entry["dtype"].is_string() || !dtype_of(entry["dtype"].get<std::string>(), dtype))
      throw bad("tensor '" + name + "' has dtype " + entry["dtype"].dump() + ", expected " + kDtypeList);
    const uint64_t item = c10::elementSize(dtype);
    const auto& shape_json = entry["shape"];
    const auto& offsets = entry["data_offsets"];
    if (!shape_json.is_array() || !offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned())
      throw bad("tensor '" + name + "' has a malformed shape or data_offsets");
    std::vector<int64_t> shape;
    uint64_t elements = 1;
    for (const auto& d : shape_json) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40)) throw bad("tensor '" + name + "' has a bad dimension");
      const uint64_t n = d.get<uint64_t>();
      shape.push_back(static_cast<int64_t>(n));
      // Checked before multiplying: the product of two dimensions <= 2^40 could wrap.
      if (n != 0 && elements > (uint64_t{1} << 40) / n) throw bad("tensor '" + name + "' is too large");
      elements *= n;
    }
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    if (begin > end || end > data_bytes || end - begin != elements * item)
      throw bad(fmt::format("tensor '{}' has data_offsets [{}, {}] for {} values of {} bytes in {} data bytes", name,
                            begin, end, elements, item, data_bytes));
    at::Tensor t = at::empty(shape, dtype);  // host: read from the file
    f.seekg(static_cast<std::streamoff>(8 + n + begin));
    f.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(end - begin));
    if (!f) throw bad("tensor '" + name + "' could not be read");
    out.tensors[name] = t;
    spans.emplace_back(begin, end);
  }
  std::sort(spans.begin(), spans.end());
  uint64_t at_byte = 0;
  for (const auto& [b, e] : spans) {
    if (b != at_byte) throw bad("tensor data do not tile the data section (gap or overlap)");
    at_byte = e;
  }
  if (at_byte != data_bytes) throw bad(fmt::format("{} data bytes, the tensors cover {}", data_bytes, at_byte));
  return out;
}

}  // namespace loom::tensor_io
