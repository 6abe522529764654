#include "pack/crc32.h"

#include <immintrin.h>

#include <array>
#include <cstring>

namespace qtk {

namespace {

// The register of the reflected CRC: bit 31 - t holds the coefficient of x^t.
constexpr uint32_t kPoly = 0xEDB88320u;

// x^n mod P in the reflected representation.
constexpr uint32_t xpow_mod(unsigned n) {
  uint32_t r = 0x80000000u;  // x^0
  for (unsigned i = 0; i < n; ++i) r = (r >> 1) ^ ((r & 1u) ? kPoly : 0u);
  return r;
}

// The 64-bit multiplier that moves a reflected 64-bit half-block forward by
// `e` bits: carry-less multiplying the half (bit i <-> x^(63-i)) by this lane
// gives a 128-bit block whose bit n <-> x^(127-n), i.e. the half times
// x^e mod P, already reduced below degree 128.
// note: the lane holds (x^(e-1) mod P) in its upper 32 bits: the product's
// bit n then carries x^(63 + 64 - n), so one factor x comes from the layout.
constexpr uint64_t fold_lane(unsigned e) { return static_cast<uint64_t>(xpow_mod(e - 1)) << 32; }

// Folding a 128-bit block (low half L: x^127..x^64, high half H: x^63..x^0)
// forward by D bits: L * x^(64+D) + H * x^D.
constexpr uint64_t kFold128Lo = fold_lane(64 + 128), kFold128Hi = fold_lane(128);
constexpr uint64_t kFold512Lo = fold_lane(64 + 512), kFold512Hi = fold_lane(512);
constexpr uint64_t kFold2048Lo = fold_lane(64 + 2048), kFold2048Hi = fold_lane(2048);

using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t n = 0; n < 256; ++n) {
    uint32_t c = n;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? kPoly : 0u);
    t[0][n] = c;
  }
  for (int k = 1; k < 8; ++k)
    for (uint32_t n = 0; n < 256; ++n) t[k][n] = (t[k - 1][n] >> 8) ^ t[0][t[k - 1][n] & 0xFF];
  return t;
}

constexpr Tables kTables = make_tables();

inline uint32_t load_le32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;  // x86: little-endian
}

// The raw register update (no inversions), eight bytes a step (slicing-by-8).
uint32_t raw_table(uint32_t r, const uint8_t* p, size_t n) {
  const auto& t = kTables;
  while (n >= 8) {
    const uint32_t lo = r ^ load_le32(p), hi = load_le32(p + 4);
    r = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
        t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) r = (r >> 8) ^ t[0][(r ^ *p++) & 0xFF];
  return r;
}

// Carry-less-multiply folding. The message is reduced modulo P to one
// 128-bit block R with the same residue (the register state is XORed into
// its first four bytes, as a reflected CRC allows); the raw CRC of the whole
// prefix is then the table CRC of R's 16 bytes from a zero register.
__attribute__((target("pclmul,sse4.1"))) inline __m128i fold128(__m128i x, __m128i k,
                                                                __m128i next) {
  return _mm_xor_si128(
      _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next);
}

__attribute__((target("pclmul,sse4.1"))) uint32_t raw_pclmul(uint32_t r, const uint8_t* p,
                                                             size_t n) {
  // note: below 64 bytes there is not one 4-way step; the table is as fast.
  if (n < 64) return raw_table(r, p, n);
  const auto ld = [](const uint8_t* q) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  };
  __m128i x0 = _mm_xor_si128(ld(p), _mm_cvtsi32_si128(static_cast<int>(r)));
  __m128i x1 = ld(p + 16), x2 = ld(p + 32), x3 = ld(p + 48);
  p += 64;
  n -= 64;
  const __m128i k512 =
      _mm_set_epi64x(static_cast<long long>(kFold512Hi), static_cast<long long>(kFold512Lo));
  while (n >= 64) {
    x0 = fold128(x0, k512, ld(p));
    x1 = fold128(x1, k512, ld(p + 16));
    x2 = fold128(x2, k512, ld(p + 32));
    x3 = fold128(x3, k512, ld(p + 48));
    p += 64;
    n -= 64;
  }
  const __m128i k128 =
      _mm_set_epi64x(static_cast<long long>(kFold128Hi), static_cast<long long>(kFold128Lo));
  __m128i x = fold128(x0, k128, x1);
  x = fold128(x, k128, x2);
  x = fold128(x, k128, x3);
  while (n >= 16) {
    x = fold128(x, k128, ld(p));
    p += 16;
    n -= 16;
  }
  alignas(16) uint8_t block[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(block), x);
  return raw_table(raw_table(0, block, 16), p, n);
}

#define QTK_CRC_AVX512 __attribute__((target("avx512f,avx512vl,vpclmulqdq,pclmul,sse4.1")))

QTK_CRC_AVX512 inline __m512i fold512(__m512i x, __m512i k, __m512i next) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00),
                                   _mm512_clmulepi64_epi128(x, k, 0x11), next, 0x96);
}

// The same with 512-bit registers: four 64-byte accumulators, 256 bytes a
// step. Their 256 bytes are a message with the prefix's residue, which the
// 128-bit path reduces further.
QTK_CRC_AVX512 uint32_t raw_vpclmul(uint32_t r, const uint8_t* p, size_t n) {
  // note: 512 bytes make at least one 256-byte step after the first load;
  // shorter inputs go to the 128-bit path.
  if (n < 512) return raw_pclmul(r, p, n);
  const auto hi = static_cast<long long>(kFold2048Hi), lo = static_cast<long long>(kFold2048Lo);
  const __m512i k = _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo);
  __m512i z0 = _mm512_xor_si512(_mm512_loadu_si512(p),
                                _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(r))));
  __m512i z1 = _mm512_loadu_si512(p + 64), z2 = _mm512_loadu_si512(p + 128),
          z3 = _mm512_loadu_si512(p + 192);
  p += 256;
  n -= 256;
  while (n >= 256) {
    z0 = fold512(z0, k, _mm512_loadu_si512(p));
    z1 = fold512(z1, k, _mm512_loadu_si512(p + 64));
    z2 = fold512(z2, k, _mm512_loadu_si512(p + 128));
    z3 = fold512(z3, k, _mm512_loadu_si512(p + 192));
    p += 256;
    n -= 256;
  }
  alignas(64) uint8_t rest[256];
  _mm512_store_si512(rest, z0);
  _mm512_store_si512(rest + 64, z1);
  _mm512_store_si512(rest + 128, z2);
  _mm512_store_si512(rest + 192, z3);
  return raw_pclmul(raw_pclmul(0, rest, sizeof rest), p, n);
}

using RawFn = uint32_t (*)(uint32_t, const uint8_t*, size_t);

RawFn raw_fn(Crc32Impl impl) {
  switch (impl) {
    case Crc32Impl::kVpclmul:
      return raw_vpclmul;
    case Crc32Impl::kPclmul:
      return raw_pclmul;
    case Crc32Impl::kTable:
      break;
  }
  return raw_table;
}

Crc32Impl select_impl() {
  if (crc32_available(Crc32Impl::kVpclmul)) return Crc32Impl::kVpclmul;
  if (crc32_available(Crc32Impl::kPclmul)) return Crc32Impl::kPclmul;
  return Crc32Impl::kTable;
}

}  // namespace

bool crc32_available(Crc32Impl impl) {
  __builtin_cpu_init();
  switch (impl) {
    case Crc32Impl::kVpclmul:
      return __builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("pclmul") &&
             __builtin_cpu_supports("sse4.1");
    case Crc32Impl::kPclmul:
      return __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    case Crc32Impl::kTable:
      return true;
  }
  return false;
}

Crc32Impl crc32_selected() {
  static const Crc32Impl impl = select_impl();
  return impl;
}

const char* crc32_name(Crc32Impl impl) {
  switch (impl) {
    case Crc32Impl::kVpclmul:
      return "vpclmulqdq";
    case Crc32Impl::kPclmul:
      return "pclmulqdq";
    case Crc32Impl::kTable:
      break;
  }
  return "table";
}

uint32_t crc32_update_with(Crc32Impl impl, uint32_t crc, const void* data, size_t size) {
  return ~raw_fn(impl)(~crc, static_cast<const uint8_t*>(data), size);
}

uint32_t crc32_update(uint32_t crc, const void* data, size_t size) {
  static const RawFn fn = raw_fn(crc32_selected());
  return ~fn(~crc, static_cast<const uint8_t*>(data), size);
}

}  // namespace qtk
