#include "convert/dtype_convert.h"

#include <cmath>
#include <cstring>

namespace qtk {

namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

float bf16_to_f32(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return float_of(sign | 0x7F800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return float_of(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return float_of(sign);
  // Subnormal: normalise (value = mant * 2^-24).
  int e = -1;
  do {
    mant <<= 1;
    ++e;
  } while ((mant & 0x400u) == 0);
  return float_of(sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3FFu) << 13));
}

uint16_t f32_to_bf16(float f) {
  const uint32_t u = bits_of(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN
  // note: adding 0x7FFF plus the lowest kept bit rounds to nearest, ties to
  // even; a carry into the exponent is the correct result (up to inf).
  const uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

uint16_t f32_to_f16(float f) {
  const uint32_t u = bits_of(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));  // NaN
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to >= 65520: inf
  const int32_t exp = static_cast<int32_t>(a >> 23) - 127;
  if (exp >= -14) {
    // Normal f16: drop 13 mantissa bits with round-to-nearest-even; a carry
    // into the exponent field is correct.
    const uint32_t rebased = a - (112u << 23);
    const uint32_t rounded = rebased + 0x0FFFu + ((rebased >> 13) & 1u);
    return static_cast<uint16_t>(sign | (rounded >> 13));
  }
  if (exp < -25) return sign;  // below half the smallest subnormal: +-0
  // Subnormal f16: value = m * 2^-24 with m = round(full * 2^(exp + 1)),
  // where full is the 24-bit significand (value = full * 2^(exp - 23)).
  // note: m may round up to 0x400, which is exactly the smallest normal.
  const uint32_t full = (a & 0x7FFFFFu) | 0x800000u;
  const uint32_t dropped = static_cast<uint32_t>(-exp - 1);  // 14..24
  const uint32_t kept = full >> dropped;
  const uint32_t rem = full & ((1u << dropped) - 1u);
  const uint32_t half = 1u << (dropped - 1);
  uint32_t m = kept;
  if (rem > half || (rem == half && (kept & 1u))) ++m;
  return static_cast<uint16_t>(sign | m);
}

bool is_pack_float(DType t) { return t == DType::BF16 || t == DType::F16 || t == DType::F32; }

namespace {

template <typename Load, typename Store>
void convert_loop(const uint8_t* s, size_t ss, uint8_t* d, size_t ds, size_t n, Load load,
                  Store store) {
  for (size_t i = 0; i < n; ++i) store(d + i * ds, load(s + i * ss));
}

float load_any(const uint8_t* p, DType t) {
  if (t == DType::F32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return t == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

void store_any(uint8_t* p, DType t, float f) {
  if (t == DType::F32) {
    std::memcpy(p, &f, 4);
    return;
  }
  const uint16_t h = t == DType::BF16 ? f32_to_bf16(f) : f32_to_f16(f);
  std::memcpy(p, &h, 2);
}

}  // namespace

float round_to_odd_f32(double d) {
  if (std::isnan(d)) return static_cast<float>(d);
  if (std::isinf(d)) return static_cast<float>(d);
  const double a = std::fabs(d);
  float f = static_cast<float>(a);  // nearest; may be inf beyond FLT_MAX
  if (std::isinf(f) || static_cast<double>(f) > a) f = std::nextafter(f, 0.0f);
  if (static_cast<double>(f) != a) f = float_of(bits_of(f) | 1u);
  return d < 0 ? -f : f;
}

void dequantize_fp8_row(const uint8_t* src, const uint8_t* scale_row, int64_t col0,
                        int64_t block_cols, void* dst, DType dst_type, size_t n) {
  auto* d = static_cast<uint8_t*>(dst);
  const size_t ds = static_cast<size_t>(dtype_size(dst_type));
  for (size_t i = 0; i < n; ++i) {
    const int64_t col = col0 + static_cast<int64_t>(i);
    float scale;
    std::memcpy(&scale, scale_row + 4 * (col / block_cols), 4);
    const double exact = static_cast<double>(fp8_e4m3_to_f32(src[i])) * scale;
    if (dst_type == DType::F32) {
      store_any(d + i * ds, dst_type, static_cast<float>(exact));
    } else {
      store_any(d + i * ds, dst_type, round_to_odd_f32(exact));
    }
  }
}

void convert_elements(const void* src, DType st, void* dst, DType dt, size_t n) {
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  if (st == dt) {
    std::memcpy(d, s, n * static_cast<size_t>(dtype_size(st)));
    return;
  }
  // note: the two hot cases get their own loops so the compiler can
  // vectorise them; the rest go through the generic per-element path.
  if (st == DType::BF16 && dt == DType::F32) {
    convert_loop(
        s, 2, d, 4, n,
        [](const uint8_t* p) {
          uint16_t h;
          std::memcpy(&h, p, 2);
          return static_cast<uint32_t>(h) << 16;
        },
        [](uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); });
    return;
  }
  if (st == DType::F32 && dt == DType::BF16) {
    convert_loop(
        s, 4, d, 2, n,
        [](const uint8_t* p) {
          float f;
          std::memcpy(&f, p, 4);
          return f;
        },
        [](uint8_t* p, float f) {
          const uint16_t h = f32_to_bf16(f);
          std::memcpy(p, &h, 2);
        });
    return;
  }
  const size_t ss = static_cast<size_t>(dtype_size(st)), ds = static_cast<size_t>(dtype_size(dt));
  for (size_t i = 0; i < n; ++i) store_any(d + i * ds, dt, load_any(s + i * ss, st));
}

}  // namespace qtk
