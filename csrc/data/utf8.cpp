#include "data/utf8.h"

#include <cstdint>

namespace loom::data {
namespace {

// Number of bytes of the well-formed sequence at text[i], or 0 if ill-formed; on failure
// `subpart` is the length of its maximal subpart (at least 1), the bytes one U+FFFD replaces.
size_t sequence_at(std::string_view text, size_t i, size_t* subpart) {
  const auto b0 = static_cast<uint8_t>(text[i]);
  if (b0 < 0x80) return 1;
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    *subpart = 1;
    return 0;
  }
  size_t k = 1;
  for (; k < need; ++k) {
    if (i + k >= text.size()) break;
    const auto b = static_cast<uint8_t>(text[i + k]);
    const uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) break;
  }
  if (k == need) return need;
  *subpart = k;
  return 0;
}

}  // namespace

size_t utf8_valid_prefix(std::string_view text) {
  size_t i = 0, sub = 0;
  while (i < text.size()) {
    // Fast path over ASCII, eight bytes at a time.
    while (i + 8 <= text.size()) {
      uint64_t w;
      __builtin_memcpy(&w, text.data() + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= text.size()) break;
    const size_t n = sequence_at(text, i, &sub);
    if (n == 0) return i;
    i += n;
  }
  return text.size();
}

std::string utf8_replace_invalid(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 8);
  size_t i = 0;
  while (i < text.size()) {
    size_t valid = utf8_valid_prefix(text.substr(i));
    out.append(text.data() + i, valid);
    i += valid;
    if (i >= text.size()) break;
    size_t sub = 1;
    sequence_at(text, i, &sub);
    out += "\xEF\xBF\xBD";
    i += sub;
  }
  return out;
}

}  // namespace loom::data
