// GPT-2's reversible map between the 256 byte values and printable Unicode characters, so a
// byte-level vocabulary can be stored as text (OpenAI gpt-2 encoder.py, `bytes_to_unicode`).
#pragma once
#include <array>
#include <cstdint>
#include <string>

namespace loom::data {

/// Code point standing for byte b: the byte itself for '!'..'~', U+00A1..U+00AC and
/// U+00AE..U+00FF; the remaining 68 bytes get U+0100, U+0101, ... in increasing byte order.
const std::array<uint32_t, 256>& byte_to_codepoint();

/// Inverse of byte_to_codepoint(): the byte for code point cp, or -1 if cp stands for none.
int codepoint_to_byte(uint32_t cp);

/// Appends the UTF-8 encoding of code point cp to out.
void append_utf8(std::string& out, uint32_t cp);

}  // namespace loom::data
