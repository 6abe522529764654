#include "tokenizer/byte_level.h"

#include <array>

#include "core/utf8.h"
#include "tokenizer/unicode_classes.h"

namespace qtk::byte_level {
namespace {

constexpr bool stands_for_itself(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Tables {
  std::array<uint32_t, 256> to_char{};
  std::array<int16_t, 512> to_byte{};  // every alphabet code point is < 0x144
};

constexpr Tables make_tables() {
  Tables t{};
  for (auto& v : t.to_byte) v = -1;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = stands_for_itself(b) ? static_cast<uint32_t>(b) : next++;
    t.to_char[static_cast<size_t>(b)] = cp;
    t.to_byte[cp] = static_cast<int16_t>(b);
  }
  return t;
}
constexpr Tables kTables = make_tables();

}  // namespace

uint32_t byte_to_char(uint8_t byte) { return kTables.to_char[byte]; }

std::optional<uint8_t> char_to_byte(uint32_t cp) {
  if (cp >= kTables.to_byte.size() || kTables.to_byte[cp] < 0) return std::nullopt;
  return static_cast<uint8_t>(kTables.to_byte[cp]);
}

void append_token_bytes(std::string& out, std::string_view token) {
  const size_t start = out.size();
  const auto* s = reinterpret_cast<const unsigned char*>(token.data());
  size_t i = 0;
  while (i < token.size()) {
    uint32_t cp;
    i += unicode::decode_utf8(s, i, cp);
    const std::optional<uint8_t> b = char_to_byte(cp);
    if (!b) {
      out.resize(start);
      out.append(token);
      return;
    }
    out.push_back(static_cast<char>(*b));
  }
}

std::string token_bytes(std::string_view token) {
  std::string bytes;
  append_token_bytes(bytes, token);
  return bytes;
}

std::string to_token_string(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) unicode::append_utf8(out, byte_to_char(static_cast<uint8_t>(c)));
  return out;
}

void append_utf8_lossy(std::string& out, std::string_view bytes) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  out.reserve(out.size() + n);
  size_t i = 0;
  while (i < n) {
    const unsigned char b = s[i];
    if (b < 0x80) {
      out.push_back(static_cast<char>(b));
      ++i;
      continue;
    }
    size_t need;
    unsigned char lo, hi;  // allowed range of the second byte
    if (!utf8_lead_byte(b, need, lo, hi)) {
      out.append(kReplacement, 3);  // a byte that never starts a sequence
      ++i;
      continue;
    }
    // note: the replaced unit is the longest prefix of a valid sequence (the
    // "maximal subpart" of Unicode ch. 3), so E4 B8 41 gives U+FFFD 'A' and a
    // truncated sequence at the end gives one U+FFFD.
    size_t k = 1;
    if (i + 1 < n && s[i + 1] >= lo && s[i + 1] <= hi) {
      k = 2;
      while (k <= need && i + k < n && (s[i + k] & 0xC0) == 0x80) ++k;
    }
    if (k == need + 1) {
      out.append(bytes.data() + i, k);
    } else {
      out.append(kReplacement, 3);
    }
    i += k;
  }
}

}  // namespace qtk::byte_level
