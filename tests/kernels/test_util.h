// Helpers shared by the kernel tests: seeded random data and bf16/f16 packing.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace qtk::test {

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline uint16_t float_to_bf16(float f) {  // round to nearest even
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

// Finite values only; round to nearest even; subnormals included.
inline uint16_t float_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  float a = std::fabs(f);
  if (a >= 65504.0f) return sign | 0x7BFF;
  if (a < std::ldexp(1.0f, -14)) {  // subnormal: multiples of 2^-24
    return sign | static_cast<uint16_t>(std::nearbyint(std::ldexp(a, 24)));
  }
  int e;
  float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int mant = static_cast<int>(std::nearbyint((m * 2.0f - 1.0f) * 1024.0f));
  int exp = e - 1 + 15;
  if (mant == 1024) {
    mant = 0;
    ++exp;
  }
  return sign | static_cast<uint16_t>(exp << 10) | static_cast<uint16_t>(mant);
}

inline bool bit_equal(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

}  // namespace qtk::test
