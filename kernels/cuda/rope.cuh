// RoPE on the device: the frequency -> position-axis map (M-RoPE), the
// (cos, sin) pairs (shared by norm.cu's kernels and the fused decode
// attention), and the per-head norm + RoPE of one warp with the head's
// values in registers (the fused decode attention; norm.cu's norm_rope_row
// does the same operations in the same order on a row in shared memory,
// and the two are compared bit for bit in tests/cuda/test_attention.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace qtk::cuda::dev {

// The position axis that rotary frequency j reads (0 t, 1 h, 2 w).
__device__ __forceinline__ int rope_axis(int j, const RopeParams& p) {
  if (p.n_sections == 0) return 0;
  if (p.interleaved) {
    // note: transformers' apply_interleaved_mrope: frequencies start on the
    // temporal axis; j % 3 == 1 (== 2) below 3*section[1] (3*section[2])
    // take the height (width) axis.
    int axis = 0;
    for (int a = 1; a < 3; ++a)
      if (j % 3 == a && j < 3 * p.sections[a]) axis = a;
    return axis;
  }
  if (j < p.sections[0]) return 0;
  if (j < p.sections[0] + p.sections[1]) return 1;
  return 2;
}

// (cos, sin) of frequency j at position pos, each rounded to float.
__device__ __forceinline__ float2 rope_cos_sin(int j, int32_t pos, const RopeParams& rope) {
  const int rd = static_cast<int>(rope.rotary_dim);
  // float32 like transformers: base ** (arange(0, dim, 2).float() / dim), then 1 / that.
  const float exponent = static_cast<float>(2 * j) / static_cast<float>(rd);
  const float p = static_cast<float>(
      pow(static_cast<double>(static_cast<float>(rope.theta)), static_cast<double>(exponent)));
  const float inv_freq = 1.0f / p;  // note: never rounded to the weights' dtype (kernels/rope.h)
  const float angle = __fmul_rn(inv_freq, static_cast<float>(pos));  // float32, as the reference
  double s, c;
  sincos(static_cast<double>(angle), &s, &c);
  return make_float2(static_cast<float>(c), static_cast<float>(s));
}

// (cos, sin) of frequency j for token t: from the table where it has the
// position, else computed (the same values).
__device__ __forceinline__ float2 rope_cos_sin_at(int j, int64_t t,
                                                  const int32_t* __restrict__ positions,
                                                  int64_t tokens, const RopeParams& rope) {
  const int half = static_cast<int>(rope.rotary_dim / 2);
  const int32_t pos = positions[rope_axis(j, rope) * tokens + t];
  return pos >= 0 && pos < rope.table_positions ? rope.table[static_cast<int64_t>(pos) * half + j]
                                                : rope_cos_sin(j, pos, rope);
}

// True when every rotate_half pair (j, j + rotary_dim/2) falls in one lane
// of a warp that holds columns lane + 32 i: rotary_dim/2 a multiple of 32.
__host__ __device__ inline bool rope_pairs_in_lane(const RopeParams& rope) {
  return rope.rotary_dim > 0 && (rope.rotary_dim / 2) % 32 == 0;
}

// The pieces of one (token t, head) row's norm + RoPE by one warp, lane
// holding column lane + 32 i in v[i] (zero past dim). They are separate so
// that a kernel can fetch the constants (norm weights) and the token's
// (cos, sin) pairs before its dependency wait, and every row of the token
// shares them.
// note: the arithmetic and its order are norm_rope_row's (norm.cu): the sum
// of squares over the lane's columns in increasing order then warp_sum,
// v * inv * w, and the rotation in double from the f32 (cos, sin).
// Needs rope_pairs_in_lane; pairs = rotary_dim / 64 rotate_half pairs
// (register i, register i + pairs) per lane, at most kPer / 2.
template <int kPer>
struct LaneRope {
  float2 cs[kPer / 2 > 0 ? kPer / 2 : 1];  // (cos, sin) of frequency lane + 32 i, i < pairs
  int pairs = 0;
};

// This lane's (cos, sin) pairs for token t.
template <int kPer>
__device__ __forceinline__ LaneRope<kPer> lane_rope(const int32_t* __restrict__ positions,
                                                    int64_t tokens, int64_t t,
                                                    const RopeParams& rope) {
  const int lane = threadIdx.x & 31;
  LaneRope<kPer> r;
  r.pairs = static_cast<int>(rope.rotary_dim / 64);
#pragma unroll
  for (int i = 0; i < kPer / 2; ++i)
    if (i < r.pairs) r.cs[i] = rope_cos_sin_at(lane + 32 * i, t, positions, tokens, rope);
  return r;
}

// The norm weights of this lane's columns (zero past dim).
template <int kPer>
__device__ __forceinline__ void lane_norm_weights(float (&w)[kPer],
                                                  const float* __restrict__ norm_w, int dim) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < kPer; ++i) w[i] = lane + 32 * i < dim ? norm_w[lane + 32 * i] : 0.0f;
}

// RMSNorm of the row with the lane's weights w.
template <int kPer>
__device__ __forceinline__ void norm_lane(float (&v)[kPer], int dim, const float (&w)[kPer],
                                          float eps) {
  const int lane = threadIdx.x & 31;
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    if (lane + 32 * i < dim) {
      const float a = v[i];
      ss += a * a;
    }
  const float inv = rsqrtf(warp_sum(ss) / static_cast<float>(dim) + eps);
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    if (lane + 32 * i < dim) v[i] = v[i] * inv * w[i];
}

// The rotation. note: pairs is dispatched to a constant (P) so that the
// registers are indexed statically (a runtime index would put v in local
// memory).
template <int kPer, int P = 1>
__device__ __forceinline__ void rope_lane(float (&v)[kPer], const LaneRope<kPer>& r) {
  if constexpr (P <= kPer / 2) {
    if (r.pairs != P) return rope_lane<kPer, P + 1>(v, r);
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const double cf = r.cs[i].x, sf = r.cs[i].y;
      const double a = v[i], b = v[i + P];
      v[i] = static_cast<float>(a * cf - b * sf);
      v[i + P] = static_cast<float>(b * cf + a * sf);
    }
  }
}

}  // namespace qtk::cuda::dev
