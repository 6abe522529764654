#include "kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
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

namespace {

// note: cos/sin of (position p, frequency j) depend on nothing else, so a
// thread keeps a table for positions 0..max seen for the current
// (theta, rotary_dim), filled lazily; entries are the same values the direct
// computation gives, so caching cannot change a bit. M-RoPE reads the entry
// of the position of frequency j's axis.
struct RopeTable {
  double theta = 0.0;
  int64_t rotary_dim = 0;
  int64_t positions = 0;        // rows filled
  std::vector<float> inv_freq;  // f32 [half]
  std::vector<float> cos_sin;   // f32 [positions][half][2]

  void reset(double th, int64_t rd) {
    theta = th;
    rotary_dim = rd;
    positions = 0;
    cos_sin.clear();
    const int64_t half = rd / 2;
    inv_freq.resize(half);
    const float theta_f = static_cast<float>(th);
    for (int64_t j = 0; j < half; ++j) {
      // float32 like transformers: arange(0, dim, 2).float() / dim, then
      // base ** that (float pow), then 1 / that.
      float exponent = static_cast<float>(2 * j) / static_cast<float>(rd);
      float p =
          static_cast<float>(std::pow(static_cast<double>(theta_f), static_cast<double>(exponent)));
      inv_freq[j] = 1.0f / p;
    }
  }

  void grow_to(int64_t max_position) {
    if (max_position < positions) return;
    const int64_t half = rotary_dim / 2;
    int64_t target = std::max<int64_t>(max_position + 1, positions * 2);
    cos_sin.resize(target * half * 2);
    for (int64_t p = positions; p < target; ++p) {
      for (int64_t j = 0; j < half; ++j) {
        float angle = inv_freq[j] * static_cast<float>(p);  // float32 product, as the reference
        cos_sin[(p * half + j) * 2] = static_cast<float>(std::cos(static_cast<double>(angle)));
        cos_sin[(p * half + j) * 2 + 1] = static_cast<float>(std::sin(static_cast<double>(angle)));
      }
    }
    positions = target;
  }
};

}  // namespace

void rope_apply(float* x, int64_t rows, int64_t heads, int64_t head_dim, int64_t ld,
                const int32_t* positions, int64_t rotary_dim, double theta,
                const int64_t* mrope_section, int n_sections, bool interleaved) {
  const int64_t half = rotary_dim / 2;
  if (half <= 0 || rows <= 0) return;
  thread_local RopeTable table;
  thread_local std::vector<int> axis_of;
  if (table.theta != theta || table.rotary_dim != rotary_dim) {
    table.reset(theta, rotary_dim);
  }
  axis_of.resize(half);
  const int n_axes = mrope_section != nullptr ? 3 : 1;
  int64_t max_pos = 0;
  for (int a = 0; a < n_axes; ++a)
    for (int64_t t = 0; t < rows; ++t)
      max_pos = std::max<int64_t>(max_pos, positions[a * rows + t]);
  table.grow_to(max_pos);
  for (int64_t j = 0; j < half; ++j) {
    axis_of[j] = rope_axis_of_frequency(j, mrope_section, n_sections, interleaved);
  }
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      float* xh = x + t * ld + h * head_dim;
      for (int64_t j = 0; j < half; ++j) {
        const int64_t p = positions[axis_of[j] * rows + t];
        const float* cs = &table.cos_sin[(p * half + j) * 2];
        double x1 = xh[j], x2 = xh[j + half];
        double c = cs[0], s = cs[1];
        xh[j] = static_cast<float>(x1 * c - x2 * s);
        xh[j + half] = static_cast<float>(x2 * c + x1 * s);
      }
    }
  }
}

}  // namespace qtk
