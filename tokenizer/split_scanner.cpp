#include "tokenizer/split_scanner.h"

#include <array>
#include <cstdint>

#include "tokenizer/unicode_classes.h"

namespace qtk {
namespace {

using unicode::CharClass;

constexpr std::array<CharClass, 128> make_ascii_classes() {
  std::array<CharClass, 128> t{};
  for (int c = 0; c < 128; ++c) {
    CharClass k = CharClass::kOther;
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
      k = CharClass::kLetter;
    else if (c >= '0' && c <= '9')
      k = CharClass::kNumber;
    else if (c == '\r' || c == '\n')
      k = CharClass::kNewline;
    else if (c == ' ' || c == '\t' || c == 0x0B || c == 0x0C)
      k = CharClass::kSpace;
    t[static_cast<size_t>(c)] = k;
  }
  return t;
}
constexpr std::array<CharClass, 128> kAsciiClass = make_ascii_classes();

struct Char {
  uint32_t cp;
  CharClass cls;
  uint32_t len;
};

inline Char char_at(const unsigned char* s, size_t i) {
  if (s[i] < 0x80) return {s[i], kAsciiClass[s[i]], 1};
  uint32_t cp;
  const size_t len = unicode::decode_utf8(s, i, cp);
  return {cp, unicode::char_class(cp), static_cast<uint32_t>(len)};
}

// End of the run of characters of class `cls` starting at i.
inline size_t run_end(const unsigned char* s, size_t n, size_t i, CharClass cls) {
  while (i < n) {
    if (s[i] < 0x80) {
      if (kAsciiClass[s[i]] != cls) break;
      ++i;
    } else {
      const Char c = char_at(s, i);
      if (c.cls != cls) break;
      i += c.len;
    }
  }
  return i;
}

inline bool is_ascii_ci(unsigned char c, char lower) { return (c | 0x20) == lower; }

// (?i:'s|'t|'re|'ve|'m|'ll|'d) with the apostrophe already at s[i-1]; returns
// the end of the match or 0.
// note: under (?i) Oniguruma also matches U+017F LATIN SMALL LETTER LONG S for
// 's' (its simple case fold is 's'); no other code point folds to these letters.
inline size_t contraction_end(const unsigned char* s, size_t n, size_t i) {
  const unsigned char c = s[i];
  if (is_ascii_ci(c, 's') || is_ascii_ci(c, 't') || is_ascii_ci(c, 'm') || is_ascii_ci(c, 'd')) {
    return i + 1;
  }
  if (c == 0xC5 && i + 1 < n && s[i + 1] == 0xBF) return i + 2;  // U+017F
  if (i + 1 < n) {
    const unsigned char d = s[i + 1];
    if ((is_ascii_ci(c, 'r') || is_ascii_ci(c, 'v')) && is_ascii_ci(d, 'e')) return i + 2;
    if (is_ascii_ci(c, 'l') && is_ascii_ci(d, 'l')) return i + 2;
  }
  return 0;
}

}  // namespace

size_t split_piece_end(std::string_view text, size_t begin) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  const Char c = char_at(s, begin);
  const size_t next = begin + c.len;

  // 1. (?i:'s|'t|'re|'ve|'m|'ll|'d)
  if (c.cp == '\'' && next < n) {
    if (const size_t end = contraction_end(s, n, next)) return end;
  }
  // 2. [^\r\n\p{L}\p{N}]?\p{L}+
  if (c.cls == CharClass::kLetter) return run_end(s, n, next, CharClass::kLetter);
  const bool has_next = next < n;
  const Char d = has_next ? char_at(s, next) : Char{0, CharClass::kOther, 0};
  if ((c.cls == CharClass::kSpace || c.cls == CharClass::kOther) && has_next &&
      d.cls == CharClass::kLetter) {
    return run_end(s, n, next + d.len, CharClass::kLetter);
  }
  // 3. \p{N}
  if (c.cls == CharClass::kNumber) return next;
  // 4.  ?[^\s\p{L}\p{N}]+[\r\n]*
  if (c.cls == CharClass::kOther || (c.cp == ' ' && has_next && d.cls == CharClass::kOther)) {
    const size_t start = c.cls == CharClass::kOther ? next : next + d.len;
    size_t end = run_end(s, n, start, CharClass::kOther);
    while (end < n && (s[end] == '\r' || s[end] == '\n')) ++end;
    return end;
  }
  // c is whitespace: the rest of the alternatives all start with \s.
  size_t end = begin;
  size_t last_newline = std::string_view::npos;
  size_t last_start = begin;
  while (end < n) {
    const Char w = char_at(s, end);
    if (w.cls != CharClass::kSpace && w.cls != CharClass::kNewline) break;
    if (w.cls == CharClass::kNewline) last_newline = end;
    last_start = end;
    end += w.len;
  }
  // 5. \s*[\r\n]+ : greedy \s* backs off to the last newline of the run.
  if (last_newline != std::string_view::npos) return last_newline + 1;
  // 6. \s+(?!\S) : the whole run at the end of the text, otherwise the run
  //    minus its last character (which then prefixes the next piece).
  if (end == n) return end;
  if (last_start > begin) return last_start;
  // 7. \s+ : a single whitespace character before a non-space.
  return end;
}

}  // namespace qtk
