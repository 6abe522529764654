// UTF-8 validation shared by the JSON reader, the tokenizer and the loaders.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace qtk {

// Appends the UTF-8 encoding of cp (a Unicode scalar value).
void append_utf8(std::string& out, uint32_t cp);

// The lead byte b of a multi-byte sequence: the continuation bytes it needs
// and the allowed range [lo, hi] of the second byte (which excludes overlong
// forms, surrogates and code points above U+10FFFF). False when b never
// starts a multi-byte sequence (ASCII, a continuation byte, C0, C1, F5..FF).
bool utf8_lead_byte(unsigned char b, size_t& need, unsigned char& lo, unsigned char& hi);

// Length of the well-formed UTF-8 sequence at s[0] (avail >= 1 bytes
// readable), or 0 when it is ill-formed or truncated. Overlong forms, UTF-16
// surrogates and code points above U+10FFFF are ill-formed.
size_t utf8_sequence_length(const unsigned char* s, size_t avail);

// Byte offset of the first ill-formed UTF-8 sequence in `bytes`, or
// std::string_view::npos when all of it is valid.
size_t find_invalid_utf8(std::string_view bytes);

// The first line of a JSONL file without the UTF-8 byte order mark that may
// open the file (editors on Windows write one); it is not part of the JSON.
inline std::string_view without_byte_order_mark(std::string_view first_line) {
  return first_line.substr(0, 3) == "\xEF\xBB\xBF" ? first_line.substr(3) : first_line;
}

}  // namespace qtk
