// Element conversions between the float types a pack stores.
//
// note: the rules, which tests check bit for bit:
//   - bf16 -> f32 and f16 -> f32 are exact (widening).
//   - f32 -> bf16 and f32 -> f16 round to nearest, ties to even (IEEE 754
//     default), overflow goes to +-inf, f16 subnormals are produced exactly,
//     NaN stays NaN (quiet bit set, sign kept).
//   - bf16 <-> f16 go through f32; the widening step is exact, so there is
//     one rounding.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace qtk {

float bf16_to_f32(uint16_t h);
float f16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);
uint16_t f32_to_f16(float f);

// True for the element types convert reads and writes (BF16, F16, F32).
bool is_pack_float(DType t);

// Converts n elements. src and dst may be unaligned; they must not overlap.
// Both dtypes must satisfy is_pack_float().
void convert_elements(const void* src, DType src_type, void* dst, DType dst_type, size_t n);

// Dequantizes n consecutive F8_E4M3 elements of one matrix row, starting at
// column col0, into dst (dst_type BF16, F16 or F32): element i is
// fp8(src[i]) x scale[(col0 + i) / block_cols], where `scale_row` points at
// the row's float32 block scales (unaligned; read with memcpy).
// note: the rounding: the product of an e4m3 value (4 significant bits) and
// a float32 scale (24) has at most 28 significant bits, so it is exact in
// float64; it is then rounded once to dst_type, to nearest, ties to even.
// For F32 that is exactly the float32 product fp8 x scale that the runtime's
// FP8 kernels compute, so a --dtype f32 pack gives the same bits as the FP8
// pack. For BF16 and F16 the one rounding goes through float32 rounded to
// odd (exact whenever the target has at least 2 bits fewer than float32's
// 24, as both have), so there is no double rounding. The product is not
// exact in float32 in general (up to 28 bits): relative error <= 2^-24.
void dequantize_fp8_row(const uint8_t* src, const uint8_t* scale_row, int64_t col0,
                        int64_t block_cols, void* dst, DType dst_type, size_t n);

// d rounded to float32 with round-to-odd (inexact results get the odd
// neighbour toward zero); finite d beyond the float range gives +-FLT_MAX.
float round_to_odd_f32(double d);

}  // namespace qtk
