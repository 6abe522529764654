#include "kernels/norm.h"

#include <cmath>

#include "kernels/cpu/simd_math.h"

namespace qtk {

namespace {

// Sum of squares in double, 4 lanes (i % 4) and a fixed tree.
QTK_CLONES double sum_squares(const float* __restrict x, int64_t n) {
  double lane[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int l = 0; l < 4; ++l) {
      double v = x[i + l];
      lane[l] += v * v;
    }
  }
  for (int l = 0; i < n; ++i, ++l) {
    double v = x[i];
    lane[l] += v * v;
  }
  return (lane[0] + lane[2]) + (lane[1] + lane[3]);
}

QTK_CLONES void scale_row(const float* x, const float* __restrict w, double inv, float* y,
                          int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    y[i] = static_cast<float>(static_cast<double>(x[i]) * inv * static_cast<double>(w[i]));
  }
}

QTK_CLONES void scale_row_gated(const float* x, const float* __restrict z,
                                const float* __restrict w, double inv, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    // note: norm in double; silu(z) in float with the portable exp, as the
    // reference applies it after the (float) normalised value.
    double normed = static_cast<double>(w[i]) * (static_cast<double>(x[i]) * inv);
    y[i] = static_cast<float>(normed * static_cast<double>(cpu::silu_poly(z[i])));
  }
}

QTK_CLONES void scale_row_plain(float* x, double factor, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(static_cast<double>(x[i]) * factor);
}

}  // namespace

void rmsnorm_heads(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy,
                   int64_t tokens, int64_t heads, int64_t head_dim, float eps) {
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* xr = x + t * ldx + h * head_dim;
      float* yr = y + t * ldy + h * head_dim;
      double mean = sum_squares(xr, head_dim) / static_cast<double>(head_dim);
      double inv = 1.0 / std::sqrt(mean + static_cast<double>(eps));
      scale_row(xr, w, inv, yr, head_dim);
    }
  }
}

void rmsnorm(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int64_t rows,
             int64_t cols, float eps) {
  rmsnorm_heads(x, ldx, w, y, ldy, rows, 1, cols, eps);
}

void gated_rmsnorm(const float* x, int64_t ldx, const float* z, int64_t ldz, const float* w,
                   float* y, int64_t ldy, int64_t tokens, int64_t heads, int64_t head_dim,
                   float eps) {
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* xr = x + t * ldx + h * head_dim;
      const float* zr = z + t * ldz + h * head_dim;
      float* yr = y + t * ldy + h * head_dim;
      double mean = sum_squares(xr, head_dim) / static_cast<double>(head_dim);
      double inv = 1.0 / std::sqrt(mean + static_cast<double>(eps));
      scale_row_gated(xr, zr, w, inv, yr, head_dim);
    }
  }
}

void l2norm_heads(float* x, int64_t ldx, int64_t tokens, int64_t heads, int64_t head_dim, float eps,
                  float scale) {
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      float* xr = x + t * ldx + h * head_dim;
      double inv = 1.0 / std::sqrt(sum_squares(xr, head_dim) + static_cast<double>(eps));
      scale_row_plain(xr, inv * static_cast<double>(scale), head_dim);
    }
  }
}

}  // namespace qtk
