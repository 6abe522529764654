// Conversion rules checked against independent references: GCC's _Float16
// conversions (libgcc's soft-float __truncsfhf2 / __extendhfsf2) for f16,
// and an exact nearest-even search in double for bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "convert/dtype_convert.h"

namespace qtk {
namespace {

uint32_t bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
float from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

uint16_t ref_f16(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}

// bf16 reference: of the two bf16 neighbours (truncation and truncation + 1
// ulp), take the nearer in exact double arithmetic; on a tie the even one.
uint16_t ref_bf16(float f) {
  const uint32_t u = bits(f);
  const uint16_t lo = static_cast<uint16_t>(u >> 16);
  const uint16_t hi = static_cast<uint16_t>(lo + 1);
  const double x = std::fabs(static_cast<double>(f));
  const double vlo = std::fabs(static_cast<double>(from_bits(static_cast<uint32_t>(lo) << 16)));
  const float fhi = from_bits(static_cast<uint32_t>(hi) << 16);
  // note: when the upper neighbour is inf, compare against 2^128, the value
  // it would have if the exponent range went on (IEEE overflow rule).
  const double vhi = std::isinf(fhi) ? std::ldexp(1.0, 128) : std::fabs(static_cast<double>(fhi));
  const double dlo = x - vlo, dhi = vhi - x;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(DtypeConvert, F16ToF32IsExactForAll65536) {
  for (uint32_t i = 0; i < 65536; ++i) {
    _Float16 h;
    const uint16_t u = static_cast<uint16_t>(i);
    std::memcpy(&h, &u, 2);
    const float want = static_cast<float>(h);
    const float got = f16_to_f32(u);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << i;
      continue;
    }
    ASSERT_EQ(bits(got), bits(want)) << std::hex << i;
  }
}

TEST(DtypeConvert, Bf16ToF32IsTheUpperHalf) {
  for (uint32_t i = 0; i < 65536; i += 3) ASSERT_EQ(bits(bf16_to_f32(static_cast<uint16_t>(i))), i << 16);
}

// Values that stress rounding: random bit patterns over the whole range,
// ties, values just around the overflow and subnormal boundaries.
std::vector<float> probe_values() {
  std::vector<float> v;
  std::mt19937 rng(12345);
  for (int i = 0; i < 200000; ++i) v.push_back(from_bits(rng()));
  for (int i = 0; i < 50000; ++i) {
    // f16 range: exponents -30..17, so f16 subnormals and overflow are hit.
    const int e = static_cast<int>(rng() % 48) - 30;
    v.push_back(std::ldexp(1.0f + static_cast<float>(rng() % 8388608) / 8388608.0f, e) * ((rng() & 1) ? 1 : -1));
  }
  for (uint32_t base : {0x3f800000u, 0x47000000u, 0x33800000u, 0x38800000u, 0x7f7f0000u}) {
    for (uint32_t low : {0x0000u, 0x0FFFu, 0x1000u, 0x1001u, 0x3000u, 0x7FFFu, 0x8000u, 0x8001u, 0x18000u, 0xFFFFu}) {
      v.push_back(from_bits(base | low));
      v.push_back(-from_bits(base | low));
    }
  }
  for (float f : {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 65536.0f, 1e-8f, 2.9802322e-8f, 5.9604645e-8f,
                  6.1035156e-5f, 6.0975552e-5f, std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::denorm_min()})
    v.push_back(f);
  return v;
}

TEST(DtypeConvert, F32ToF16RoundsToNearestEven) {
  for (float f : probe_values()) {
    const uint16_t got = f32_to_f16(f);
    const uint16_t want = ref_f16(f);
    if (std::isnan(f)) {
      ASSERT_EQ(got & 0x7C00u, 0x7C00u);
      ASSERT_NE(got & 0x3FFu, 0u);
      continue;
    }
    ASSERT_EQ(got, want) << std::hexfloat << f;
  }
}

TEST(DtypeConvert, F32ToBf16RoundsToNearestEven) {
  for (float f : probe_values()) {
    const uint16_t got = f32_to_bf16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(bf16_to_f32(got)));
      continue;
    }
    ASSERT_EQ(got, ref_bf16(f)) << std::hexfloat << f;
  }
}

TEST(DtypeConvert, NarrowingBetweenHalfTypesRoundsOnce) {
  // bf16 -> f16 equals f32 -> f16 of the exact bf16 value.
  for (uint32_t i = 0; i < 65536; i += 1) {
    const uint16_t b = static_cast<uint16_t>(i);
    uint16_t out;
    convert_elements(&b, DType::BF16, &out, DType::F16, 1);
    const float f = bf16_to_f32(b);
    if (std::isnan(f)) continue;
    ASSERT_EQ(out, ref_f16(f)) << i;
  }
}

TEST(DtypeConvert, BulkConversionMatchesScalarUnaligned) {
  std::vector<float> src = probe_values();
  src.resize(10001);
  std::vector<uint8_t> raw(src.size() * 4 + 1), out(src.size() * 2 + 1);
  std::memcpy(raw.data() + 1, src.data(), src.size() * 4);  // deliberately unaligned
  convert_elements(raw.data() + 1, DType::F32, out.data() + 1, DType::BF16, src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, out.data() + 1 + 2 * i, 2);
    if (!std::isnan(src[i])) {
      ASSERT_EQ(h, f32_to_bf16(src[i])) << i;
    }
  }
}

}  // namespace
}  // namespace qtk
