// Portable FP8 matmul path: the scalar f32-weight path's arithmetic
// (matmul_scalar.cpp: 8 lanes, separate multiply and add, the same lane tree)
// with each weight computed as e4m3 value x block scale in float32.
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/matmul_fp8_paths.h"

namespace qtk::cpu {

namespace {

constexpr int kLanes = 8;

// The e4m3fn value of every byte, from the format's definition (bias 7,
// subnormals mant/8 * 2^-6, S.1111.111 NaN, no infinities).
struct E4m3Table {
  float v[256];
  E4m3Table() {
    for (int b = 0; b < 256; ++b) {
      const int e = (b >> 3) & 0xF, m = b & 7;
      float mag;
      if (e == 0xF && m == 7) {
        mag = std::numeric_limits<float>::quiet_NaN();
      } else if (e == 0) {
        mag = std::ldexp(static_cast<float>(m), -9);
      } else {
        mag = std::ldexp(static_cast<float>(8 + m), e - 10);
      }
      v[b] = (b & 0x80) ? -mag : mag;
    }
  }
};

const E4m3Table& table() {
  static const E4m3Table t;
  return t;
}

}  // namespace

void matmul_fp8_cols_scalar(const float* x, int64_t ldx, const uint8_t* wq, const float* scale,
                            int64_t sld, int64_t br, int64_t bc, float* y, int64_t ldy, int64_t M,
                            int64_t K, int64_t n_begin, int64_t n_end, bool /*big_scales*/) {
  const float* lut = table().v;
  for (int64_t n = n_begin; n < n_end; ++n) {
    const uint8_t* wr = wq + n * K;
    const float* sr = scale + (n / br) * sld;
    for (int64_t m = 0; m < M; ++m) {
      const float* xr = x + m * ldx;
      // note: as matmul_scalar.cpp: lane l sums k = l, l + 8, ... in
      // increasing k, multiply then add (no FMA: -ffp-contract=off); the
      // weight is one float32 product, rounded before it is used.
      float lane[kLanes] = {};
      int64_t k = 0;
      for (; k + kLanes <= K; k += kLanes) {
        const float s = sr[k / bc];  // bc is a multiple of 8: one block per group
        for (int l = 0; l < kLanes; ++l) lane[l] += xr[k + l] * (lut[wr[k + l]] * s);
      }
      for (int l = 0; k < K; ++k, ++l) lane[l] += xr[k] * (lut[wr[k]] * sr[k / bc]);
      float s4[4], s2[2];
      for (int i = 0; i < 4; ++i) s4[i] = lane[i] + lane[i + 4];
      for (int i = 0; i < 2; ++i) s2[i] = s4[i] + s4[i + 2];
      y[m * ldy + n] = s2[0] + s2[1];
    }
  }
}

}  // namespace qtk::cpu
