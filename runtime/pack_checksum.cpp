#include "runtime/pack_checksum.h"

#include <cstring>

namespace qtk {

namespace {

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ULL;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// note: the spec reads input little-endian; memcpy is one load on x86/ARM LE.
inline uint64_t read64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline uint32_t read32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline uint64_t xxh_round(uint64_t acc, uint64_t lane) {
  acc += lane * kP2;
  acc = rotl(acc, 31);
  return acc * kP1;
}

inline uint64_t merge(uint64_t acc, uint64_t v) {
  acc ^= xxh_round(0, v);
  return acc * kP1 + kP4;
}

// Consumes whole 32-byte stripes; returns the number of bytes consumed.
size_t consume_stripes(uint64_t acc[4], const uint8_t* p, size_t size) {
  const size_t n = size / 32 * 32;
  uint64_t a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3];
  for (size_t i = 0; i < n; i += 32) {
    a0 = xxh_round(a0, read64(p + i));
    a1 = xxh_round(a1, read64(p + i + 8));
    a2 = xxh_round(a2, read64(p + i + 16));
    a3 = xxh_round(a3, read64(p + i + 24));
  }
  acc[0] = a0;
  acc[1] = a1;
  acc[2] = a2;
  acc[3] = a3;
  return n;
}

}  // namespace

void Xxh64::reset(uint64_t seed) {
  seed_ = seed;
  acc_[0] = seed + kP1 + kP2;
  acc_[1] = seed + kP2;
  acc_[2] = seed;
  acc_[3] = seed - kP1;
  total_ = 0;
  buf_len_ = 0;
}

void Xxh64::update(const void* data, size_t size) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  total_ += size;
  if (buf_len_ > 0) {
    const size_t take = size < 32 - buf_len_ ? size : 32 - buf_len_;
    std::memcpy(buf_ + buf_len_, p, take);
    buf_len_ += take;
    p += take;
    size -= take;
    if (buf_len_ < 32) return;
    consume_stripes(acc_, buf_, 32);
    buf_len_ = 0;
  }
  const size_t used = consume_stripes(acc_, p, size);
  p += used;
  size -= used;
  std::memcpy(buf_, p, size);
  buf_len_ = size;
}

uint64_t Xxh64::digest() const {
  uint64_t h;
  if (total_ >= 32) {
    h = rotl(acc_[0], 1) + rotl(acc_[1], 7) + rotl(acc_[2], 12) + rotl(acc_[3], 18);
    h = merge(h, acc_[0]);
    h = merge(h, acc_[1]);
    h = merge(h, acc_[2]);
    h = merge(h, acc_[3]);
  } else {
    h = seed_ + kP5;
  }
  h += total_;
  const uint8_t* p = buf_;
  size_t n = buf_len_;
  while (n >= 8) {
    h ^= xxh_round(0, read64(p));
    h = rotl(h, 27) * kP1 + kP4;
    p += 8;
    n -= 8;
  }
  if (n >= 4) {
    h ^= static_cast<uint64_t>(read32(p)) * kP1;
    h = rotl(h, 23) * kP2 + kP3;
    p += 4;
    n -= 4;
  }
  while (n > 0) {
    h ^= static_cast<uint64_t>(*p) * kP5;
    h = rotl(h, 11) * kP1;
    ++p;
    --n;
  }
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

uint64_t xxh64(const void* data, size_t size, uint64_t seed) {
  Xxh64 s(seed);
  s.update(data, size);
  return s.digest();
}

std::string checksum_hex(uint64_t value) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i) {
    s[static_cast<size_t>(i)] = kDigits[value & 0xF];
    value >>= 4;
  }
  return s;
}

bool parse_checksum_hex(std::string_view text, uint64_t* value) {
  if (text.size() != 16) return false;
  uint64_t v = 0;
  for (char c : text) {
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else
      return false;
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *value = v;
  return true;
}

}  // namespace qtk
