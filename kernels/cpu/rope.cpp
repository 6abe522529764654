#include "kernels/rope.h"

#include <cmath>
#include <vector>

namespace qtk {

int rope_axis_of_frequency(int64_t j, const int64_t* mrope_section, int n_sections,
                           bool interleaved) {
  if (mrope_section == nullptr || n_sections <= 0) return 0;
  if (interleaved) {
    // transformers' apply_interleaved_mrope: temporal everywhere, then axis a
    // in (1, 2) overwrites j = a, a+3, a+6, ... below 3 * section[a].
    int axis = 0;
    for (int a = 1; a < n_sections && a < 3; ++a) {
      if (j % 3 == a && j < 3 * mrope_section[a]) axis = a;
    }
    return axis;
  }
  int64_t end = 0;
  for (int a = 0; a < n_sections; ++a) {
    end += mrope_section[a];
    if (j < end) return a;
  }
  return 0;  // past the sections: temporal, as for text
}

void rope_apply(float* x, int64_t rows, int64_t heads, int64_t head_dim, int64_t ld,
                const int32_t* positions, int64_t rotary_dim, double theta,
                const int64_t* mrope_section, int n_sections, bool interleaved) {
  const int64_t half = rotary_dim / 2;
  if (half <= 0 || rows <= 0) return;
  // note: per-call tables of size rotary_dim/2, reused by a thread across
  // calls (no allocation once warm).
  thread_local std::vector<float> inv_freq, cos_t, sin_t;
  thread_local std::vector<int> axis_of;
  inv_freq.resize(half);
  cos_t.resize(half);
  sin_t.resize(half);
  axis_of.resize(half);
  const float theta_f = static_cast<float>(theta);
  for (int64_t j = 0; j < half; ++j) {
    // float32 like transformers: arange(0, dim, 2).float() / dim, then
    // base ** that (float pow), then 1 / that.
    float exponent = static_cast<float>(2 * j) / static_cast<float>(rotary_dim);
    float p = static_cast<float>(std::pow(static_cast<double>(theta_f), static_cast<double>(exponent)));
    inv_freq[j] = 1.0f / p;
    axis_of[j] = rope_axis_of_frequency(j, mrope_section, n_sections, interleaved);
  }
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t j = 0; j < half; ++j) {
      float pos = static_cast<float>(positions[axis_of[j] * rows + t]);
      float angle = inv_freq[j] * pos;  // float32 product, as the reference
      cos_t[j] = static_cast<float>(std::cos(static_cast<double>(angle)));
      sin_t[j] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* xh = x + t * ld + h * head_dim;
      for (int64_t j = 0; j < half; ++j) {
        double x1 = xh[j], x2 = xh[j + half];
        double c = cos_t[j], s = sin_t[j];
        xh[j] = static_cast<float>(x1 * c - x2 * s);
        xh[j + half] = static_cast<float>(x2 * c + x1 * s);
      }
    }
  }
}

}  // namespace qtk
