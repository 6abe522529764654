// Element types of safetensors files and packs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace qtk {

// note: the set is safetensors' own; later stages reject, by name, what they
// cannot compute (F8_E5M2, integer weights). F8_E4M3 is read as block-FP8
// weights with float32 scales (loaders/checkpoint.h).
enum class DType : uint8_t {
  BF16,
  F16,
  F32,
  F64,
  I8,
  I16,
  I32,
  I64,
  U8,
  U16,
  U32,
  U64,
  BOOL,
  F8_E4M3,
  F8_E5M2,
};

// Size of one element in bytes.
constexpr int64_t dtype_size(DType t) {
  switch (t) {
    case DType::BF16:
    case DType::F16:
    case DType::I16:
    case DType::U16:
      return 2;
    case DType::F32:
    case DType::I32:
    case DType::U32:
      return 4;
    case DType::F64:
    case DType::I64:
    case DType::U64:
      return 8;
    case DType::I8:
    case DType::U8:
    case DType::BOOL:
    case DType::F8_E4M3:
    case DType::F8_E5M2:
      return 1;
  }
  return 0;
}

// The value of an F8_E4M3 byte (the "e4m3fn" format of FP8 checkpoints:
// 1 sign, 4 exponent bits with bias 7, 3 mantissa bits, no infinities,
// S.1111.111 is NaN; largest finite 448, smallest subnormal 2^-9).
// note: every e4m3 value is exactly a float (4 significant bits, exponents
// -9..8), so this is exact.
float fp8_e4m3_to_f32(uint8_t b);

// The first block-FP8 scale the FP8 kernels cannot use, as
// first_fp8_scale_fault finds it. A NaN or infinite scale would poison every
// output of its block, a negative one flips its sign, a zero one over
// non-zero FP8 data erases it (a zero scale over an all-zero block is
// harmless), and one beyond FLT_MAX / 448 (e4m3fn's largest value) may
// overflow the kernels' float32 product fp8 x scale.
struct Fp8ScaleFault {
  enum class Kind { kNotFinite, kNegative, kZeroOverData, kOverflow };
  Kind kind = Kind::kNotFinite;
  int64_t block_row = 0, block_col = 0;  // the scale's index
  float scale = 0;
  int64_t row = -1, col = -1;  // kZeroOverData, kOverflow: the element that shows it
  uint8_t byte = 0;            // and its F8_E4M3 byte
};

// Checks the float32 scales (`scales`, [ceil(rows / block_rows),
// ceil(cols / block_cols)], any alignment) of the F8_E4M3 matrix `weights`
// [rows, cols] in scale order; nullopt when every scale is usable.
// note: only a zero or so large a scale has its block's bytes read.
std::optional<Fp8ScaleFault> first_fp8_scale_fault(const void* scales, const uint8_t* weights,
                                                   int64_t rows, int64_t cols, int64_t block_rows,
                                                   int64_t block_cols);

// The index of the first of the `n` elements of dtype `t` at `data` that is
// not finite (NaN or inf; for F8_E4M3 the e4m3fn NaN bytes 0x7f and 0xff, as
// it has no inf), or n. Dtypes without such values (integers, F8_E5M2): n.
size_t first_non_finite(const void* data, DType t, size_t n);

// The safetensors spelling: "BF16", "F32", ...
std::string_view dtype_name(DType t);

// Parses the safetensors spelling; nullopt for anything else.
std::optional<DType> parse_dtype(std::string_view name);

}  // namespace qtk
