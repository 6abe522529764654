#include "kernels/norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/ref/reference.h"
#include "tests/kernels/test_util.h"

namespace qtk {
namespace {

// note: kernel and reference both compute in double and round once; the
// double values differ only in summation order (~1e-16 relative), so the
// float results agree to 1 ulp (2^-23 relative; 2^-22 allows for a tie).
constexpr double kOneUlp = 2.4e-7;

TEST(Norm, RmsnormMatchesReference) {
  for (int64_t cols : {1, 3, 17, 63, 130, 1024}) {
    for (int64_t rows : {1, 3, 5}) {
      const int64_t ld = cols + 2;
      auto x = test::random_floats(rows * ld, 1 + cols, 3.0f);
      auto w = test::random_floats(cols, 2 + cols);
      std::vector<float> y(rows * ld), y_ref(rows * ld);
      rmsnorm(x.data(), ld, w.data(), y.data(), ld, rows, cols, 1e-6f);
      ref::rmsnorm_ref(x.data(), ld, w.data(), y_ref.data(), ld, rows, cols, 1e-6f);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          float a = y[r * ld + c], b = y_ref[r * ld + c];
          ASSERT_NEAR(a, b, kOneUlp * std::fabs(b) + 1e-35) << cols << " " << r << " " << c;
        }
      }
      // In place gives the same bits.
      std::vector<float> xi = x;
      rmsnorm(xi.data(), ld, w.data(), xi.data(), ld, rows, cols, 1e-6f);
      for (int64_t r = 0; r < rows; ++r) {
        ASSERT_TRUE(test::bit_equal(xi.data() + r * ld, y.data() + r * ld, cols));
      }
    }
  }
}

TEST(Norm, PerHeadRmsnormEqualsRowsOfHeadDim) {
  const int64_t T = 3, H = 5, D = 24, ld = H * D + 7;
  auto x = test::random_floats(T * ld, 5);
  auto w = test::random_floats(D, 6);
  std::vector<float> y(T * ld, 0.0f), y_ref(T * H * D);
  rmsnorm_heads(x.data(), ld, w.data(), y.data(), ld, T, H, D, 1e-6f);
  std::vector<float> packed(T * H * D);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H * D; ++i) packed[t * H * D + i] = x[t * ld + i];
  ref::rmsnorm_ref(packed.data(), D, w.data(), y_ref.data(), D, T * H, D, 1e-6f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H * D; ++i)
      ASSERT_NEAR(y[t * ld + i], y_ref[t * H * D + i], kOneUlp * std::fabs(y_ref[t * H * D + i]) + 1e-35);
}

TEST(Norm, GatedRmsnormMatchesReference) {
  for (int64_t D : {1, 3, 17, 128}) {
    const int64_t T = 4, H = 3, ld = H * D + 1;
    auto x = test::random_floats(T * ld, 7 + D);
    auto z = test::random_floats(T * ld, 8 + D, 4.0f);
    auto w = test::random_floats(D, 9 + D);
    std::vector<float> y(T * ld), y_ref(T * ld);
    gated_rmsnorm(x.data(), ld, z.data(), ld, w.data(), y.data(), ld, T, H, D, 1e-6f);
    ref::gated_rmsnorm_ref(x.data(), ld, z.data(), ld, w.data(), y_ref.data(), ld, T, H, D, 1e-6f);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < H * D; ++i) {
        // note: silu(z) uses the float exp polynomial (<= ~2 ulp) and one
        // float division: a few ulp of the result.
        float b = y_ref[t * ld + i];
        ASSERT_NEAR(y[t * ld + i], b, 1e-6 * std::fabs(b) + 1e-30) << D << " " << t << " " << i;
      }
  }
}

TEST(Norm, L2normMatchesReference) {
  for (int64_t D : {1, 3, 17, 128}) {
    const int64_t T = 3, H = 2, ld = H * D + 3;
    auto x = test::random_floats(T * ld, 10 + D);
    auto x_ref = x;
    float scale = 1.0f / std::sqrt(static_cast<float>(D));
    l2norm_heads(x.data(), ld, T, H, D, 1e-6f, scale);
    ref::l2norm_heads_ref(x_ref.data(), ld, T, H, D, 1e-6f, scale);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_NEAR(x[i], x_ref[i], kOneUlp * std::fabs(x_ref[i]) + 1e-35) << D << " " << i;
    }
  }
}

}  // namespace
}  // namespace qtk
