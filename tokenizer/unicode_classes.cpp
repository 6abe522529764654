#include "tokenizer/unicode_classes.h"

#include <utf8proc.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "core/error.h"

namespace qtk::unicode {
namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr uint8_t kClassMask = 0x07;
constexpr uint8_t kInertBit = 0x08;

CharClass compute_class(uint32_t cp) {
  if (cp == '\r' || cp == '\n') return CharClass::kNewline;
  if (cp == '\t' || cp == 0x0B || cp == 0x0C || cp == 0x85) return CharClass::kSpace;
  // note: HF tokenizers matches the pattern with Oniguruma 6.9.9 (Unicode
  // 15.1); utf8proc 2.8 has Unicode 15.0. The one block of letters 15.1 added
  // is CJK Extension I, patched in here.
  if (cp >= 0x2EBF0 && cp <= 0x2EE5D) return CharClass::kLetter;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return CharClass::kLetter;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return CharClass::kNumber;
    case UTF8PROC_CATEGORY_ZS:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
      return CharClass::kSpace;
    default:
      return CharClass::kOther;
  }
}

bool has_canonical_decomposition(const utf8proc_property_t* p) {
  // note: decomp_type 0 with a decomposition sequence means canonical;
  // compatibility decompositions (type != 0) do not matter for NFC.
  return p->decomp_seqindex != UINT16_MAX && p->decomp_type == 0;
}

// One byte per code point: class in the low bits, kInertBit when NFC-inert.
// note: 1.1 MB built once per process (a few ms) so that every lookup during
// encoding is one load, for all planes alike.
std::unique_ptr<uint8_t[]> build_table() {
  auto table = std::make_unique<uint8_t[]>(kMaxCodePoint + 1);
  // Code points that occur after the first position of some canonical
  // decomposition: the possible second halves of a composition (plus a few
  // more, which only sends some text to the slow path).
  std::vector<bool> is_second(kMaxCodePoint + 1, false);
  for (uint32_t cp = 0; cp <= kMaxCodePoint; ++cp) {
    const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
    if (!has_canonical_decomposition(p)) continue;
    utf8proc_int32_t parts[8];
    int last_boundclass = 0;
    const utf8proc_ssize_t n = utf8proc_decompose_char(static_cast<utf8proc_int32_t>(cp), parts, 8,
                                                       UTF8PROC_DECOMPOSE, &last_boundclass);
    for (utf8proc_ssize_t k = 1; k < n && k < 8; ++k)
      is_second[static_cast<uint32_t>(parts[k])] = true;
  }
  // note: Hangul syllables compose algorithmically (L+V, LV+T), outside the
  // decomposition table, so the vowel and trailing jamo are seconds too.
  for (uint32_t cp = 0x1161; cp <= 0x1175; ++cp) is_second[cp] = true;
  for (uint32_t cp = 0x11A8; cp <= 0x11C2; ++cp) is_second[cp] = true;
  for (uint32_t cp = 0; cp <= kMaxCodePoint; ++cp) {
    const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
    const bool surrogate = cp >= 0xD800 && cp <= 0xDFFF;
    const bool inert =
        !surrogate && p->combining_class == 0 && !has_canonical_decomposition(p) && !is_second[cp];
    table[cp] =
        static_cast<uint8_t>(static_cast<uint8_t>(compute_class(cp)) | (inert ? kInertBit : 0));
  }
  return table;
}

const uint8_t* table() {
  static const std::unique_ptr<uint8_t[]> kTable = build_table();
  return kTable.get();
}

}  // namespace

CharClass char_class(uint32_t cp) {
  if (cp > kMaxCodePoint) return CharClass::kOther;
  return static_cast<CharClass>(table()[cp] & kClassMask);
}

bool is_nfc_inert(uint32_t cp) { return cp <= kMaxCodePoint && (table()[cp] & kInertBit) != 0; }

namespace {
std::string utf8proc_nfc(std::string_view text) {
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &out,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) {
    // Only reachable with invalid UTF-8, which callers validate first.
    fail("NFC normalization failed: {}", utf8proc_errmsg(n));
  }
  std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}
}  // namespace

std::string nfc_reference(std::string_view text) {
  // note: utf8proc 2.8 composes an LV syllable with U+11A7 (one below the
  // first trailing jamo) and so drops the U+11A7; correct NFC leaves it alone.
  // U+11A7 is a starter that composes with nothing, so NFC distributes over
  // it: normalize the text between occurrences separately.
  constexpr std::string_view kU11A7 = "\xE1\x86\xA7";
  size_t at = text.find(kU11A7);
  if (at == std::string_view::npos) return utf8proc_nfc(text);
  std::string result;
  size_t begin = 0;
  for (; at != std::string_view::npos; at = text.find(kU11A7, begin)) {
    result += utf8proc_nfc(text.substr(begin, at - begin));
    result += kU11A7;
    begin = at + kU11A7.size();
  }
  result += utf8proc_nfc(text.substr(begin));
  return result;
}

std::string_view nfc(std::string_view text, std::string& buffer) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  // note: every code point below U+0300 is NFC-inert, and its UTF-8 lead byte
  // is below 0xCC, so a byte scan settles most text without decoding.
  size_t i = 0;
  while (i < n && s[i] < 0xCC) ++i;
  if (i == n) return text;
  // note: NFC never reaches across an inert code point (a starter that
  // composes with nothing before it), so text splits before each one. Only
  // the stretches from the inert character before a non-inert run to the
  // next inert character go through utf8proc; the rest is copied.
  const uint8_t* t = table();
  size_t copied = 0;                           // text[0, copied) is in buffer
  size_t last_inert = std::string_view::npos;  // start of the latest inert code point
  bool changed_path = false;
  // s[i] >= 0xCC is a lead byte: continuation bytes are 0x80..0xBF. Find the
  // inert code point before it by stepping back over one code point.
  if (i > 0) {
    size_t back = i - 1;
    while (back > 0 && (s[back] & 0xC0) == 0x80) --back;
    last_inert = back;  // below U+0300, so inert
  }
  while (i < n) {
    uint32_t cp;
    const size_t len = decode_utf8(s, i, cp);
    if (t[cp] & kInertBit) {
      last_inert = i;
      i += len;
      continue;
    }
    if (!changed_path) {
      buffer.clear();
      changed_path = true;
    }
    const size_t begin =
        last_inert != std::string_view::npos && last_inert >= copied ? last_inert : copied;
    size_t end = i + len;
    while (end < n) {
      const size_t l = decode_utf8(s, end, cp);
      if (t[cp] & kInertBit) break;
      end += l;
    }
    buffer.append(text.data() + copied, begin - copied);
    buffer += nfc_reference(text.substr(begin, end - begin));
    copied = end;
    i = end;
    last_inert = std::string_view::npos;
  }
  if (!changed_path) return text;
  buffer.append(text.data() + copied, n - copied);
  return buffer;
}

}  // namespace qtk::unicode
