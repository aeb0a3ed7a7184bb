#include "serve/api_fields.h"

#include <fmt/format.h>

#include <cmath>

#include "serve/limits.h"

namespace loom::serve::fields {

using nlohmann::json;

namespace {
// Field names quoted in errors are cut to this many bytes.
constexpr size_t kMaxFieldName = 64;
}  // namespace

ApiError bad(const std::string& field, const std::string& message) { return ApiError(400, field, message); }

std::string field_name(const std::string& key) {
  return key.size() <= kMaxFieldName ? key : key.substr(0, kMaxFieldName) + "...";
}

void check_fields(const json& body, const std::set<std::string>& known) {
  if (!body.is_object()) throw bad("body", std::string("expected a JSON object, found ") + body.type_name());
  for (const auto& [key, value] : body.items())
    if (!known.count(key)) throw bad(field_name(key), "unknown field");
}

bool present(const json& body, const char* key) { return body.contains(key) && !body[key].is_null(); }

int64_t get_int(const json& body, const char* key, int64_t fallback, int64_t lo, int64_t hi) {
  if (!present(body, key)) return fallback;
  const json& v = body[key];
  if (!v.is_number_integer())
    throw bad(key, fmt::format("expected an integer in [{}, {}], found {}", lo, hi, excerpt(v)));
  const bool unsigned_big = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX);
  const int64_t x = unsigned_big ? INT64_MAX : v.get<int64_t>();
  if (x < lo || x > hi) throw bad(key, fmt::format("expected an integer in [{}, {}], found {}", lo, hi, excerpt(v)));
  return x;
}

// A temperature: 0 (greedy, when `zero_is_greedy`) or within the sampler's finite range.
double get_temperature(const json& body, const char* key, double fallback, bool zero_is_greedy) {
  if (!present(body, key)) return fallback;
  const json& v = body[key];
  const double x = v.is_number() ? v.get<double>() : std::nan("");
  if ((zero_is_greedy && x == 0.0) || (x >= limits::kMinTemperature && x <= limits::kMaxTemperature)) return x;
  throw bad(key, fmt::format("expected {}a number in [{}, {}], found {}", zero_is_greedy ? "0 (greedy) or " : "",
                             limits::kMinTemperature, limits::kMaxTemperature, excerpt(v)));
}

double get_number(const json& body, const char* key, double fallback, double lo, double hi, bool open_lo) {
  if (!present(body, key)) return fallback;
  const json& v = body[key];
  if (!v.is_number()) throw bad(key, std::string("expected a number, found ") + excerpt(v));
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi || (open_lo && x == lo))
    throw bad(key, fmt::format("expected a number in {}{}, {}], found {}", open_lo ? "(" : "[", lo, hi, excerpt(v)));
  return x;
}

bool get_bool(const json& body, const char* key, bool fallback) {
  if (!present(body, key)) return fallback;
  if (!body[key].is_boolean()) throw bad(key, std::string("expected true or false, found ") + excerpt(body[key]));
  return body[key].get<bool>();
}

// A string or a list of at most `max_count` non-empty strings of at most kMaxStopBytes each.
std::vector<std::string> get_strings(const json& body, const char* key, std::vector<std::string> fallback,
                                     size_t max_count) {
  if (!present(body, key)) return fallback;
  const json& v = body[key];
  std::vector<std::string> out;
  if (v.is_array() && v.size() > max_count)
    throw bad(key, fmt::format("at most {} strings, found {}", max_count, v.size()));
  if (v.is_string()) {
    out.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    for (const auto& s : v) {
      if (!s.is_string()) throw bad(key, "expected a string or a list of strings, found an element " + excerpt(s));
      out.push_back(s.get<std::string>());
    }
  } else {
    throw bad(key, "expected a string or a list of strings, found " + excerpt(v));
  }
  for (const auto& s : out) {
    if (s.empty()) throw bad(key, "expected non-empty strings");
    if (s.size() > limits::kMaxStopBytes)
      throw bad(key, fmt::format("a string of {} bytes, more than {}", s.size(), limits::kMaxStopBytes));
  }
  return out;
}

}  // namespace loom::serve::fields
