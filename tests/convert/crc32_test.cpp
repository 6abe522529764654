// CRC-32 (pack/crc32.h) against a bitwise reference and zlib's crc32, on
// random data of awkward sizes, offsets and starting values; and the check
// that libzip's calls reach it (pack_writer.cpp defines crc32).
#include <dlfcn.h>

#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "pack/crc32.h"

extern "C" unsigned long crc32(unsigned long crc, const unsigned char* buf, unsigned int len);

namespace qtk {
namespace {

// One bit at a time, straight from the definition.
uint32_t crc32_bitwise(uint32_t crc, const uint8_t* p, size_t n) {
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ ((crc & 1u) ? 0xEDB88320u : 0u);
  }
  return ~crc;
}

using ZlibCrc = unsigned long (*)(unsigned long, const unsigned char*, unsigned int);

// zlib's own crc32: this program's crc32 is the one pack_writer.cpp defines,
// so take the library's from its handle.
ZlibCrc zlib_crc32() {
  static ZlibCrc fn = [] {
    void* h = ::dlopen("libz.so.1", RTLD_NOW | RTLD_LOCAL);
    return h ? reinterpret_cast<ZlibCrc>(::dlsym(h, "crc32")) : nullptr;
  }();
  return fn;
}

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(g());
  return v;
}

const size_t kSizes[] = {0,    1,    2,    3,    4,    7,         8,
                         15,   16,   17,   31,   32,   63,        64,
                         65,   127,  128,  255,  256,  257,       511,
                         512,  513,  767,  1023, 1024, 1025,      4095,
                         4096, 4097, 8191, 8192, 8193, 65536 + 3, (1u << 20) + 7};

TEST(Crc32, KnownValues) {
  const char* s = "123456789";
  EXPECT_EQ(crc32_update(0, s, 9), 0xCBF43926u);  // the standard check value
  EXPECT_EQ(crc32_update(0, s, 0), 0u);
  EXPECT_EQ(crc32_update(0xFFFFFFFFu, nullptr, 0), 0xFFFFFFFFu);
}

TEST(Crc32, EveryImplMatchesReferenceAndZlib) {
  ZlibCrc zlib = zlib_crc32();
  ASSERT_NE(zlib, nullptr) << "cannot find zlib's crc32";
  const auto data = random_bytes((1u << 20) + 64, 1);
  for (Crc32Impl impl : {Crc32Impl::kTable, Crc32Impl::kPclmul, Crc32Impl::kVpclmul}) {
    if (!crc32_available(impl)) continue;
    for (size_t n : kSizes)
      for (size_t off : {0, 1, 13})  // unaligned starts
        for (uint32_t init : {0u, 0xFFFFFFFFu, 0x9E3779B9u}) {
          const uint8_t* p = data.data() + off;
          const uint32_t want = crc32_bitwise(init, p, n);
          ASSERT_EQ(static_cast<uint32_t>(zlib(init, p, static_cast<unsigned>(n))), want);
          ASSERT_EQ(crc32_update_with(impl, init, p, n), want)
              << crc32_name(impl) << " size " << n << " offset " << off << " init " << init;
        }
  }
  EXPECT_TRUE(crc32_available(crc32_selected()));
}

TEST(Crc32, PiecewiseEqualsWhole) {
  const auto data = random_bytes(3 * 4096 + 5, 2);
  const uint32_t whole = crc32_bitwise(0, data.data(), data.size());
  std::mt19937_64 g(3);
  for (int round = 0; round < 50; ++round) {
    uint32_t c = 0;
    size_t at = 0;
    while (at < data.size()) {
      const size_t n = std::min<size_t>(data.size() - at, g() % 1500);
      c = crc32_update(c, data.data() + at, n);
      at += n;
    }
    ASSERT_EQ(c, whole);
  }
}

TEST(Crc32, LibzipCallsReachThisImplementation) {
  // The global binding of crc32 (what libzip.so's calls resolve to) is the
  // definition in pack_writer.cpp, not zlib's.
  void* bound = ::dlsym(RTLD_DEFAULT, "crc32");
  EXPECT_EQ(bound, reinterpret_cast<void*>(&::crc32));
  EXPECT_NE(bound, reinterpret_cast<void*>(zlib_crc32()));
  const auto data = random_bytes(10000, 4);
  EXPECT_EQ(::crc32(0, nullptr, 0), 0u);
  EXPECT_EQ(static_cast<uint32_t>(::crc32(7, data.data(), 10000)),
            crc32_bitwise(7, data.data(), 10000));
}

}  // namespace
}  // namespace qtk
