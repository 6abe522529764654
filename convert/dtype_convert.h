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

#include "loaders/dtype.h"

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

}  // namespace qtk
