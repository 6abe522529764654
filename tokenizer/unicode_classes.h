// Unicode facts the tokenizer needs: the character classes of Qwen's split
// pattern, UTF-8 decoding/validation, and NFC.
//
// note: general categories and NFC come from utf8proc (Debian libutf8proc-dev,
// Unicode 15), a small, well-kept C library also used by Julia and PostgreSQL.
// We use it rather than generated tables so the data stays maintained by
// someone else, and rather than ICU because it is one small dependency.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/utf8.h"

namespace qtk::unicode {

// The classes that the split pattern distinguishes. Whitespace is Oniguruma's
// Unicode \s: U+0009..U+000D, U+0085 and the categories Zs, Zl, Zp; \r and \n
// are whitespace too but get their own class because the pattern names them.
enum class CharClass : uint8_t {
  kLetter = 0,   // \p{L}: Lu Ll Lt Lm Lo
  kNumber = 1,   // \p{N}: Nd Nl No
  kSpace = 2,    // \s other than \r and \n
  kNewline = 3,  // \r or \n
  kOther = 4,    // everything else: marks, punctuation, symbols, controls, ...
};

// Class of a code point (any value up to U+10FFFF).
CharClass char_class(uint32_t cp);

// True when a code point can never change under NFC, whatever surrounds it:
// combining class 0, no canonical decomposition and never the second half of
// a canonical composition. A string made only of such code points is in NFC.
bool is_nfc_inert(uint32_t cp);

// Decodes the code point at s[i] of VALID UTF-8; returns its length in bytes.
inline size_t decode_utf8(const unsigned char* s, size_t i, uint32_t& cp) {
  const unsigned char b = s[i];
  if (b < 0x80) {
    cp = b;
    return 1;
  }
  if (b < 0xE0) {
    cp = (uint32_t(b & 0x1F) << 6) | (s[i + 1] & 0x3F);
    return 2;
  }
  if (b < 0xF0) {
    cp = (uint32_t(b & 0x0F) << 12) | (uint32_t(s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
    return 3;
  }
  cp = (uint32_t(b & 0x07) << 18) | (uint32_t(s[i + 1] & 0x3F) << 12) |
       (uint32_t(s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
  return 4;
}

// note: the UTF-8 encoder and validators live in core/utf8.h (one
// implementation for the JSON reader, the loaders and the tokenizer).
using qtk::append_utf8;
using qtk::find_invalid_utf8;
using qtk::utf8_sequence_length;

// NFC of valid UTF-8 text. Returns `text` itself when it is already NFC by the
// inert test above (no copy); otherwise writes the normalized text into
// `buffer` and returns a view of it.
std::string_view nfc(std::string_view text, std::string& buffer);

// NFC through utf8proc with no fast path; the reference for tests.
std::string nfc_reference(std::string_view text);

}  // namespace qtk::unicode
