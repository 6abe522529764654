#include "pack/pack_checksum.h"

#include <xxhash.h>

#include <new>

namespace qtk {

void Xxh64::StateDeleter::operator()(XXH64_state_s* s) const { XXH64_freeState(s); }

Xxh64::Xxh64(uint64_t seed) : state_(XXH64_createState()) {
  if (!state_) throw std::bad_alloc();
  reset(seed);
}

void Xxh64::reset(uint64_t seed) { XXH64_reset(state_.get(), seed); }

void Xxh64::update(const void* data, size_t size) { XXH64_update(state_.get(), data, size); }

uint64_t Xxh64::digest() const { return XXH64_digest(state_.get()); }

uint64_t xxh64(const void* data, size_t size, uint64_t seed) { return XXH64(data, size, seed); }

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
