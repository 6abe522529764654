#include "core/dtype.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

namespace qtk {

namespace {
constexpr std::array<std::pair<DType, std::string_view>, 15> kNames = {{
    {DType::BF16, "BF16"},
    {DType::F16, "F16"},
    {DType::F32, "F32"},
    {DType::F64, "F64"},
    {DType::I8, "I8"},
    {DType::I16, "I16"},
    {DType::I32, "I32"},
    {DType::I64, "I64"},
    {DType::U8, "U8"},
    {DType::U16, "U16"},
    {DType::U32, "U32"},
    {DType::U64, "U64"},
    {DType::BOOL, "BOOL"},
    {DType::F8_E4M3, "F8_E4M3"},
    {DType::F8_E5M2, "F8_E5M2"},
}};
}  // namespace

namespace {

// The index of the first element whose bits under `mask` are all set, or n.
// note: a branch-free any-test first (vectorised), the position only on a hit.
template <typename U>
size_t first_with_all_bits(const uint8_t* data, size_t n, U mask) {
  U any = 0;
  for (size_t i = 0; i < n; ++i) {
    U u;
    std::memcpy(&u, data + i * sizeof(U), sizeof(U));
    any |= static_cast<U>((u & mask) == mask);
  }
  if (!any) return n;
  for (size_t i = 0; i < n; ++i) {
    U u;
    std::memcpy(&u, data + i * sizeof(U), sizeof(U));
    if ((u & mask) == mask) return i;
  }
  return n;
}

}  // namespace

size_t first_non_finite(const void* data, DType t, size_t n) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  switch (t) {
    case DType::F8_E4M3: {
      // note: 8 bytes a step: with the sign bits cleared each byte is at
      // most 0x7f, so adding 1 to every byte sets its top bit exactly when it
      // was 0x7f (a NaN), and no carry crosses into the next byte.
      constexpr uint64_t kLow7 = 0x7f7f7f7f7f7f7f7fULL, kOnes = 0x0101010101010101ULL,
                         kTops = 0x8080808080808080ULL;
      const size_t words = n / 8;
      uint64_t any = 0;
      for (size_t i = 0; i < words; ++i) {
        uint64_t w;
        std::memcpy(&w, bytes + 8 * i, 8);
        any |= ((w & kLow7) + kOnes) & kTops;
      }
      if (any == 0) {
        const size_t tail = first_with_all_bits<uint8_t>(bytes + 8 * words, n - 8 * words, 0x7f);
        return tail == n - 8 * words ? n : 8 * words + tail;
      }
      return first_with_all_bits<uint8_t>(bytes, n, 0x7f);
    }
    case DType::BF16:
      return first_with_all_bits<uint16_t>(bytes, n, 0x7f80);
    case DType::F16:
      return first_with_all_bits<uint16_t>(bytes, n, 0x7c00);
    case DType::F32:
      return first_with_all_bits<uint32_t>(bytes, n, 0x7f800000u);
    default:
      return n;
  }
}

std::optional<Fp8ScaleFault> first_fp8_scale_fault(const void* scales, const uint8_t* weights,
                                                   int64_t rows, int64_t cols, int64_t block_rows,
                                                   int64_t block_cols) {
  using Kind = Fp8ScaleFault::Kind;
  const int64_t scale_rows = (rows + block_rows - 1) / block_rows;
  const int64_t scale_cols = (cols + block_cols - 1) / block_cols;
  const auto* bytes = static_cast<const uint8_t*>(scales);
  for (int64_t i = 0; i < scale_rows * scale_cols; ++i) {
    Fp8ScaleFault fault;
    std::memcpy(&fault.scale, bytes + 4 * i, 4);
    const float f = fault.scale;
    fault.block_row = i / scale_cols, fault.block_col = i % scale_cols;
    if (!std::isfinite(f)) return fault;
    if (f < 0) return fault.kind = Kind::kNegative, fault;
    if (f != 0 && !std::isinf(448.0f * f)) continue;
    const int64_t r1 = std::min(rows, (fault.block_row + 1) * block_rows);
    const int64_t c0 = fault.block_col * block_cols, c1 = std::min(cols, c0 + block_cols);
    for (int64_t r = fault.block_row * block_rows; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c) {
        const uint8_t b = weights[r * cols + c];
        const bool zero_over_data = f == 0 && (b & 0x7f) != 0;
        if (!zero_over_data && !(f != 0 && std::isinf(fp8_e4m3_to_f32(b) * f))) continue;
        fault.kind = zero_over_data ? Kind::kZeroOverData : Kind::kOverflow;
        fault.row = r, fault.col = c, fault.byte = b;
        return fault;
      }
  }
  return std::nullopt;
}

float fp8_e4m3_to_f32(uint8_t b) {
  const int exp = (b >> 3) & 0xF;
  const int mant = b & 0x7;
  float mag;
  if (exp == 0xF && mant == 0x7) {
    mag = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    mag = std::ldexp(static_cast<float>(mant), -9);  // subnormal: mant/8 * 2^-6
  } else {
    mag = std::ldexp(static_cast<float>(8 + mant), exp - 10);  // (1 + mant/8) * 2^(exp-7)
  }
  return (b & 0x80) ? -mag : mag;
}

std::string_view dtype_name(DType t) {
  for (const auto& [d, n] : kNames)
    if (d == t) return n;
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& [d, n] : kNames)
    if (n == name) return d;
  return std::nullopt;
}

}  // namespace qtk
