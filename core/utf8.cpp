#include "core/utf8.h"

#include <cstdint>
#include <cstring>

namespace qtk {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// note: the byte ranges of the Unicode standard's table of well-formed UTF-8
// byte sequences; the second byte's range excludes overlong forms,
// surrogates and code points above U+10FFFF without decoding.
bool utf8_lead_byte(unsigned char b, size_t& need, unsigned char& lo, unsigned char& hi) {
  lo = 0x80;
  hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    if (b == 0xE0) lo = 0xA0;  // no overlong forms
    if (b == 0xED) hi = 0x9F;  // no surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    if (b == 0xF0) lo = 0x90;  // no overlong forms
    if (b == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return false;
  }
  return true;
}

size_t utf8_sequence_length(const unsigned char* s, size_t avail) {
  if (s[0] < 0x80) return 1;
  size_t need;
  unsigned char lo, hi;  // allowed range of the second byte
  if (!utf8_lead_byte(s[0], need, lo, hi)) return 0;
  if (need >= avail) return 0;  // truncated
  if (s[1] < lo || s[1] > hi) return 0;
  for (size_t k = 2; k <= need; ++k) {
    if ((s[k] & 0xC0) != 0x80) return 0;
  }
  return need + 1;
}

size_t find_invalid_utf8(std::string_view bytes) {
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    // note: 8 ASCII bytes at a time; most text is mostly ASCII.
    if (i + 8 <= n) {
      uint64_t word;
      std::memcpy(&word, s + i, 8);
      if ((word & 0x8080808080808080ULL) == 0) {
        i += 8;
        continue;
      }
    }
    const size_t len = utf8_sequence_length(s + i, n - i);
    if (len == 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

}  // namespace qtk
