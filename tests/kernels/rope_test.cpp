#include "kernels/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/ref/reference.h"
#include "tests/kernels/test_util.h"

namespace qtk {
namespace {

// Positions [3][rows]; text layout (all axes equal) unless given.
std::vector<int32_t> text_positions(int64_t rows, int32_t start) {
  std::vector<int32_t> p(3 * rows);
  for (int a = 0; a < 3; ++a)
    for (int64_t t = 0; t < rows; ++t) p[a * rows + t] = start + static_cast<int32_t>(t);
  return p;
}

// note: the kernel reproduces transformers' float32 inv_freq and float32
// angle (see rope.h) while the reference uses exact double angles. The
// float32 angle is off by up to ~1 ulp of the angle (2^-23 * |angle|, plus
// inv_freq's own rounding scaled by the position), which moves each rotated
// value by at most that times |x1| + |x2|.
double rope_tolerance(double x1, double x2, double angle) {
  return (std::fabs(x1) + std::fabs(x2)) * (3.0 * std::ldexp(1.0, -23) * (std::fabs(angle) + 1.0)) +
         1e-6 * (std::fabs(x1) + std::fabs(x2));
}

void check_against_ref(int64_t rows, int64_t heads, int64_t head_dim, int64_t rotary_dim,
                       double theta, const std::vector<int32_t>& pos, const int64_t* section,
                       bool interleaved) {
  const int64_t ld = heads * head_dim + 5;
  auto x = test::random_floats(rows * ld, 3 + rows + head_dim);
  auto y = x, y_ref = x;
  rope_apply(y.data(), rows, heads, head_dim, ld, pos.data(), rotary_dim, theta, section,
             section ? 3 : 0, interleaved);
  ref::rope_apply_ref(y_ref.data(), rows, heads, head_dim, ld, pos.data(), rotary_dim, theta,
                      section, section ? 3 : 0, interleaved);
  const int64_t half = rotary_dim / 2;
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t base = t * ld + h * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) {
        if (d >= rotary_dim) {
          ASSERT_EQ(y[base + d], x[base + d]) << "pass-through dim changed";
          continue;
        }
        int64_t j = d % half;
        int axis = rope_axis_of_frequency(j, section, section ? 3 : 0, interleaved);
        double angle = pos[axis * rows + t] * std::pow(theta, -2.0 * j / rotary_dim);
        double tol = rope_tolerance(x[base + j], x[base + j + half], angle);
        ASSERT_NEAR(y[base + d], y_ref[base + d], tol) << "t=" << t << " h=" << h << " d=" << d;
      }
    }
    for (int64_t i = heads * head_dim; i < ld; ++i) ASSERT_EQ(y[t * ld + i], x[t * ld + i]);
  }
}

TEST(Rope, PlainFullRotaryMatchesReference) {
  for (int64_t head_dim : {2, 6, 64, 128}) {
    check_against_ref(17, 3, head_dim, head_dim, 1e6, text_positions(17, 0), nullptr, false);
    check_against_ref(3, 2, head_dim, head_dim, 1e4, text_positions(3, 4000), nullptr, false);
  }
}

TEST(Rope, PartialRotaryLeavesTheRestUntouched) {
  check_against_ref(13, 4, 256, 64, 1e7, text_positions(13, 7), nullptr, false);
  check_against_ref(5, 1, 34, 16, 1e4, text_positions(5, 100), nullptr, false);
}

TEST(Rope, MropeMatchesReferenceForBothLayouts) {
  const int64_t rows = 11;
  std::vector<int32_t> pos(3 * rows);
  for (int64_t t = 0; t < rows; ++t) {
    pos[t] = static_cast<int32_t>(t);
    pos[rows + t] = static_cast<int32_t>(3 + t % 4);
    pos[2 * rows + t] = static_cast<int32_t>(50 - t);
  }
  const int64_t big[3] = {11, 11, 10};  // Qwen3.5-0.8B: rotary_dim 64
  const int64_t tiny[3] = {2, 1, 1};    // qwen3.5-tiny: rotary_dim 8
  check_against_ref(rows, 3, 256, 64, 1e7, pos, big, true);
  check_against_ref(rows, 3, 256, 64, 1e7, pos, big, false);
  check_against_ref(rows, 2, 32, 8, 1e7, pos, tiny, true);
  check_against_ref(rows, 2, 32, 8, 1e7, pos, tiny, false);
}

TEST(Rope, AxisPatternOfInterleavedAndContiguousLayouts) {
  const int64_t big[3] = {11, 11, 10};
  // Interleaved (transformers' apply_interleaved_mrope): T H W T H W ...,
  // with H only below 3*11 = 33 and W only below 3*10 = 30.
  const int expected_head[] = {0, 1, 2, 0, 1, 2};
  for (int j = 0; j < 6; ++j) EXPECT_EQ(rope_axis_of_frequency(j, big, 3, true), expected_head[j]);
  EXPECT_EQ(rope_axis_of_frequency(29, big, 3, true), 2);
  EXPECT_EQ(rope_axis_of_frequency(30, big, 3, true), 0);
  EXPECT_EQ(rope_axis_of_frequency(31, big, 3, true), 1);
  EXPECT_EQ(rope_axis_of_frequency(32, big, 3, true), 0);  // 32 % 3 == 2 but 32 >= 30
  // Contiguous sections: [0, 11) T, [11, 22) H, [22, 32) W.
  EXPECT_EQ(rope_axis_of_frequency(10, big, 3, false), 0);
  EXPECT_EQ(rope_axis_of_frequency(11, big, 3, false), 1);
  EXPECT_EQ(rope_axis_of_frequency(21, big, 3, false), 1);
  EXPECT_EQ(rope_axis_of_frequency(22, big, 3, false), 2);
  EXPECT_EQ(rope_axis_of_frequency(31, big, 3, false), 2);
  EXPECT_EQ(rope_axis_of_frequency(5, nullptr, 0, true), 0);
}

TEST(Rope, MropeWithEqualAxesIsBitIdenticalToPlainRope) {
  const int64_t rows = 9, heads = 2, head_dim = 64, rotary_dim = 32, ld = heads * head_dim;
  const int64_t section[3] = {6, 5, 5};
  auto x = test::random_floats(rows * ld, 77);
  auto pos = text_positions(rows, 20);
  auto a = x, b = x, c = x;
  rope_apply(a.data(), rows, heads, head_dim, ld, pos.data(), rotary_dim, 1e7, nullptr, 0, false);
  rope_apply(b.data(), rows, heads, head_dim, ld, pos.data(), rotary_dim, 1e7, section, 3, true);
  rope_apply(c.data(), rows, heads, head_dim, ld, pos.data(), rotary_dim, 1e7, section, 3, false);
  EXPECT_TRUE(test::bit_equal(a.data(), b.data(), a.size()));
  EXPECT_TRUE(test::bit_equal(a.data(), c.data(), a.size()));
}

TEST(Rope, RowsAreIndependentOfTheCall) {
  // A token's rotation depends on its position only, not on the call's rows.
  const int64_t rows = 7, heads = 3, head_dim = 32, ld = heads * head_dim;
  auto x = test::random_floats(rows * ld, 78);
  auto pos = text_positions(rows, 5);
  auto all = x;
  rope_apply(all.data(), rows, heads, head_dim, ld, pos.data(), head_dim, 1e6, nullptr, 0, false);
  for (int64_t t = 0; t < rows; ++t) {
    std::vector<float> one(x.begin() + t * ld, x.begin() + (t + 1) * ld);
    std::vector<int32_t> p1 = {pos[t], pos[t], pos[t]};
    rope_apply(one.data(), 1, heads, head_dim, ld, p1.data(), head_dim, 1e6, nullptr, 0, false);
    ASSERT_TRUE(test::bit_equal(one.data(), all.data() + t * ld, ld)) << t;
  }
}

}  // namespace
}  // namespace qtk

namespace qtk {
namespace {

// The frequencies stay float32 (transformers never rounds inv_freq to the
// checkpoint's dtype): at a long position the rotation is that of the float32
// angle, and far from the angle a bf16-rounded frequency would give.
TEST(Rope, Float32FrequenciesAtLongPositions) {
  const int64_t head_dim = 4, rotary_dim = 4;
  const double theta = 1e4;
  const int32_t p = 4000;
  std::vector<int32_t> pos = {p, p, p};
  // Frequency j = 1 is 1 / theta^(2/4) = 0.01; its bf16 value is 0.010009765625.
  float inv =
      1.0f / static_cast<float>(std::pow(static_cast<double>(static_cast<float>(theta)), 0.5));
  uint16_t hb = test::float_to_bf16(inv);
  uint32_t bits = static_cast<uint32_t>(hb) << 16;
  float inv_bf16;
  std::memcpy(&inv_bf16, &bits, 4);
  std::vector<float> x = {0.0f, 1.0f, 0.0f, 0.0f};  // pair (x[1], x[3]) = (1, 0)
  rope_apply(x.data(), 1, 1, head_dim, head_dim, pos.data(), rotary_dim, theta, nullptr, 0, false);
  const float angle = inv * static_cast<float>(p);
  // cos/sin of the float32 angle rounded to float32, then one product: exact to 1 ulp.
  EXPECT_NEAR(x[1], std::cos(static_cast<double>(angle)), 1e-7);
  EXPECT_NEAR(x[3], std::sin(static_cast<double>(angle)), 1e-7);
  const float angle_bf16 = inv_bf16 * static_cast<float>(p);  // 0.039 rad further
  EXPECT_GT(std::abs(x[3] - std::sin(static_cast<double>(angle_bf16))), 1e-2);
}

}  // namespace
}  // namespace qtk
