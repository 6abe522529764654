// Row normalisations: RMSNorm, gated RMSNorm (Gated DeltaNet output), L2 norm.
#pragma once

#include <cstdint>

namespace qtk {

// note: the sum of squares of a row is accumulated in double, in 4 lanes
// (element i goes to lane i % 4) added in a fixed tree; the scale is applied
// in double and rounded once to f32. Cheap next to any matmul, and each row's
// arithmetic depends on nothing but that row.

// y[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * w
//   x: f32 [rows, cols] stride ldx; w: f32 [cols]; y may alias x (ldy == ldx).
// note: w already includes Qwen3.5's "+1" (the pack stores 1 + w).
void rmsnorm(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int64_t rows,
             int64_t cols, float eps);

// Per-head RMSNorm (q_norm / k_norm): token t, head h is the row
// x + t*ldx + h*head_dim; w: f32 [head_dim]. y may alias x.
void rmsnorm_heads(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy,
                   int64_t tokens, int64_t heads, int64_t head_dim, float eps);

// Gated RMSNorm of Gated DeltaNet, per value head:
//   y = w * (x * rsqrt(mean(x^2) + eps)) * silu(z)
//   x, z, y: f32 [tokens, heads*head_dim] with token strides ldx, ldz, ldy;
//   w: f32 [head_dim] (plain w, no +1). y may alias x.
void gated_rmsnorm(const float* x, int64_t ldx, const float* z, int64_t ldz, const float* w,
                   float* y, int64_t ldy, int64_t tokens, int64_t heads, int64_t head_dim,
                   float eps);

// In place, per head: x = x * rsqrt(sum(x^2) + eps) * scale (transformers'
// l2norm; scale = Dk^-1/2 folds the query scaling of the gated delta rule).
//   x: f32 [tokens, heads*head_dim], token stride ldx.
void l2norm_heads(float* x, int64_t ldx, int64_t tokens, int64_t heads, int64_t head_dim,
                  float eps = 1e-6f, float scale = 1.0f);

}  // namespace qtk
