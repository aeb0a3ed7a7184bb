// Internal: "did you mean" suggestions for misspelt keys and enum values.
#pragma once

#include <string>
#include <vector>

namespace loom::config::detail {

/// Levenshtein distance (insert, delete, substitute: cost 1 each), case-insensitive.
size_t edit_distance(const std::string& a, const std::string& b);

/// The candidate closest to `word` by edit_distance (first one on ties); empty if none.
std::string closest(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace loom::config::detail
