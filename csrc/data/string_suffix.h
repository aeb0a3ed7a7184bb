// Whether a string (a path) ends with a suffix: the file-name rules of the data pipeline
// (compression and format suffixes, .idx/.bin pairs) all ask this.
#pragma once
#include <string>

namespace loom::data {

inline bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace loom::data
