#include "data/split.h"

#include <cctype>
#include <cmath>
#include <vector>

#include "data/data_error.h"

namespace loom::data {

const char* split_name(Split s) {
  switch (s) {
    case Split::kTrain: return "train";
    case Split::kValid: return "valid";
    case Split::kTest: return "test";
  }
  return "?";
}

SplitMatrix parse_split(const std::string& str) {
  // Numbers are maximal runs of [.0-9], like Python's re.findall(r"[.0-9]+", ...).
  std::vector<double> v;
  for (size_t i = 0; i < str.size();) {
    if (std::isdigit(static_cast<unsigned char>(str[i])) || str[i] == '.') {
      size_t j = i;
      while (j < str.size() && (std::isdigit(static_cast<unsigned char>(str[j])) || str[j] == '.')) ++j;
      const std::string tok = str.substr(i, j - i);
      size_t used = 0;
      double x = 0;
      try {
        x = std::stod(tok, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != tok.size()) throw DataError("splits_string '" + str + "': '" + tok + "' is not a number");
      v.push_back(x);
      i = j;
    } else {
      ++i;
    }
  }
  if (v.empty() || v.size() > 3)
    throw DataError("splits_string '" + str + "': expected 1 to 3 non-negative numbers like \"949,50,1\", found " +
                    std::to_string(v.size()));
  v.resize(3, 0.0);
  const double sum = v[0] + v[1] + v[2];
  if (!(sum > 0)) throw DataError("splits_string '" + str + "': the weights sum to 0");
  SplitMatrix m;
  double lo = 0;
  for (int i = 0; i < 3; ++i) {
    const double hi = lo + v[i] / sum;
    if (hi > lo) m[i] = std::make_pair(lo, hi);
    lo = hi;
  }
  return m;
}

std::pair<int64_t, int64_t> split_range(const SplitMatrix& m, Split s, int64_t n) {
  const auto& r = m[static_cast<int>(s)];
  if (!r) return {0, 0};
  // std::nearbyint rounds half to even in the default rounding mode, like Python's round().
  return {static_cast<int64_t>(std::nearbyint(r->first * static_cast<double>(n))),
          static_cast<int64_t>(std::nearbyint(r->second * static_cast<double>(n)))};
}

}  // namespace loom::data
