// XXH64 against values from the reference implementation (libxxhash 0.8.1,
// XXH64(data, len, seed) called through Python ctypes), and streaming
// equivalence.
#include <gtest/gtest.h>

#include <string>

#include "pack/pack_checksum.h"

namespace qtk {
namespace {

std::string pattern771() {
  std::string s;
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 256; ++i) s += static_cast<char>(i);
  return s + "xyz";
}

TEST(Checksum, MatchesReferenceXxh64) {
  struct Case {
    std::string data;
    uint64_t seed0, seed12345;
  };
  const Case cases[] = {
      {"", 0xef46db3751d8e999ULL, 0x95584af7701f808dULL},
      {"a", 0xd24ec4f1a98c6e5bULL, 0x747b860523d69ab6ULL},
      {"abc", 0x44bc2cf5ad770999ULL, 0x01700e64f6f23509ULL},
      {"0123456789abcdef0123456789abcdef!", 0x8afff4daac4e677eULL, 0x6542508015c15f85ULL},
      {pattern771(), 0xe921a1b45bd779f8ULL, 0x6b1b5d671fb93b43ULL},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(xxh64(c.data.data(), c.data.size(), 0), c.seed0) << "len " << c.data.size();
    EXPECT_EQ(xxh64(c.data.data(), c.data.size(), 12345), c.seed12345) << "len " << c.data.size();
  }
}

TEST(Checksum, StreamingEqualsOneShotForEverySplit) {
  const std::string s = pattern771();
  const uint64_t want = xxh64(s.data(), s.size());
  for (size_t a = 0; a < 100; a += 7) {
    for (size_t b = a; b < s.size(); b += 61) {
      Xxh64 h;
      h.update(s.data(), a);
      h.update(s.data() + a, b - a);
      h.update(s.data() + b, s.size() - b);
      ASSERT_EQ(h.digest(), want) << a << " " << b;
    }
  }
}

TEST(Checksum, HexRoundTrip) {
  EXPECT_EQ(checksum_hex(0x0123456789abcdefULL), "0123456789abcdef");
  uint64_t v = 0;
  EXPECT_TRUE(parse_checksum_hex("0123456789abcdef", &v));
  EXPECT_EQ(v, 0x0123456789abcdefULL);
  EXPECT_FALSE(parse_checksum_hex("0123456789ABCDEF", &v));
  EXPECT_FALSE(parse_checksum_hex("0123", &v));
}

}  // namespace
}  // namespace qtk
