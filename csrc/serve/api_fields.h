// The checks every API body field goes through (serve/http_api.h, serve/chat_api.h): unknown
// names, types and ranges, each refusal an ApiError (400) naming the field and quoting at most
// 80 bytes of the value (excerpt()). Torch-free.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "serve/http_api.h"

namespace loom::serve::fields {

/// A 400 naming `field`.
ApiError bad(const std::string& field, const std::string& message);
/// `key` cut to 64 bytes (field names quoted in errors).
std::string field_name(const std::string& key);
/// `body` is an object whose keys are all in `known` (else 400 naming the first other key).
void check_fields(const nlohmann::json& body, const std::set<std::string>& known);
/// `key` is in `body` and not null.
bool present(const nlohmann::json& body, const char* key);
/// An integer in [lo, hi], `fallback` when absent or null.
int64_t get_int(const nlohmann::json& body, const char* key, int64_t fallback, int64_t lo, int64_t hi);
/// A temperature: 0 (greedy, when `zero_is_greedy`) or within limits.h's finite range.
double get_temperature(const nlohmann::json& body, const char* key, double fallback, bool zero_is_greedy);
/// A finite number in [lo, hi] (or (lo, hi] with `open_lo`).
double get_number(const nlohmann::json& body, const char* key, double fallback, double lo, double hi,
                  bool open_lo = false);
bool get_bool(const nlohmann::json& body, const char* key, bool fallback);
/// A string or a list of at most `max_count` non-empty strings of at most limits::kMaxStopBytes.
std::vector<std::string> get_strings(const nlohmann::json& body, const char* key, std::vector<std::string> fallback,
                                     size_t max_count);

}  // namespace loom::serve::fields
