// UTF-8 validation and repair for text handed to the tokenizer.
#pragma once
#include <string>
#include <string_view>

namespace loom::data {

/// Length in bytes of the longest prefix of `text` that is well-formed UTF-8 (RFC 3629: no
/// overlong forms, no surrogates, nothing above U+10FFFF). Equals text.size() when valid.
size_t utf8_valid_prefix(std::string_view text);

/// Replaces every ill-formed subsequence of `text` by U+FFFD (bytes EF BF BD), one replacement
/// per *maximal subpart* as the Unicode Standard (ch. 3, "U+FFFD Substitution of Maximal
/// Subparts") recommends. This is exactly what Python's `bytes.decode("utf-8", errors="replace")`
/// does, so text repaired here tokenizes like the reference tokenizer fed that Python string.
std::string utf8_replace_invalid(std::string_view text);

}  // namespace loom::data
