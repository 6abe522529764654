// Portable matmul path: plain C++, no SIMD assumptions.
#include <cstdint>
#include <cstring>

#include "kernels/cpu/matmul_paths.h"

namespace qtk::cpu {

namespace {

// note: 8 lanes, like the avx2 path's vector width, so that the portable path
// has the same error behaviour (8 short chains instead of one long one).
constexpr int kLanes = 8;

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3FF) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

template <int WT>
inline float weight_at(const void* w, int64_t i) {
  if constexpr (WT == kWeightBf16) {
    return bf16_to_f32(static_cast<const uint16_t*>(w)[i]);
  } else if constexpr (WT == kWeightF16) {
    return f16_to_f32(static_cast<const uint16_t*>(w)[i]);
  } else {
    return static_cast<const float*>(w)[i];
  }
}

template <int WT>
void cols(const float* x, int64_t ldx, const void* w, float* y, int64_t ldy, int64_t M, int64_t K,
          int64_t n_begin, int64_t n_end) {
  for (int64_t n = n_begin; n < n_end; ++n) {
    const int64_t wrow = n * K;
    for (int64_t m = 0; m < M; ++m) {
      const float* xr = x + m * ldx;
      // Lane l sums k = l, l + 8, l + 16, ... in increasing k.
      // note: separate multiply and add (the portable path has no FMA);
      // -ffp-contract=off keeps the compiler from fusing them. Whole groups
      // of 8 are written as one loop so that the compiler can keep the lanes
      // in vector registers; that changes no rounding.
      float lane[kLanes] = {};
      int64_t k = 0;
      for (; k + kLanes <= K; k += kLanes) {
        for (int l = 0; l < kLanes; ++l) lane[l] += xr[k + l] * weight_at<WT>(w, wrow + k + l);
      }
      for (int l = 0; k < K; ++k, ++l) lane[l] += xr[k] * weight_at<WT>(w, wrow + k);
      // Fixed tree, the same shape as the vector paths' reduction.
      float s4[4], s2[2];
      for (int i = 0; i < 4; ++i) s4[i] = lane[i] + lane[i + 4];
      for (int i = 0; i < 2; ++i) s2[i] = s4[i] + s4[i + 2];
      y[m * ldy + n] = s2[0] + s2[1];
    }
  }
}

}  // namespace

void matmul_cols_scalar(const float* x, int64_t ldx, const void* w, int wtype, float* y,
                        int64_t ldy, int64_t M, int64_t K, int64_t n_begin, int64_t n_end) {
  switch (wtype) {
    case kWeightBf16:
      cols<kWeightBf16>(x, ldx, w, y, ldy, M, K, n_begin, n_end);
      break;
    case kWeightF16:
      cols<kWeightF16>(x, ldx, w, y, ldy, M, K, n_begin, n_end);
      break;
    default:
      cols<kWeightF32>(x, ldx, w, y, ldy, M, K, n_begin, n_end);
      break;
  }
}

}  // namespace qtk::cpu
