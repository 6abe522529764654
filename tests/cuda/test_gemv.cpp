// The skinny tensor-core product (kernels/cuda/gemv_mma.h): against the
// float64 reference on awkward sizes and padded strides, and row invariance:
// row r of an m-row call (either token-tile variant) is bitwise equal to the
// 1-row call of row r.
#include <type_traits>
#include <utility>

#include "kernels/cuda/gemv_mma.h"
#include "tests/cuda/gpu_test_util.h"
#include "tests/cuda/reference.h"

namespace qtk::cuda::test {
namespace {

template <class Out>
void check_gemv(int64_t n, int64_t k) {
  const int64_t ldx = k + 8, ldw = k + 16, ldy = n + 3, max_m = kGemvMaxM;
  auto xf = random_floats(max_m * ldx, -1, 1, 61), wf = random_floats(n * ldw, -1, 1, 62);
  const auto xh = to_device_type<bf16>(xf), wh = to_device_type<bf16>(wf);
  DeviceBuffer<bf16> x(xh), w(wh);
  // The 1-row product of every row.
  DeviceBuffer<Out> single(max_m * ldy);
  for (int64_t r = 0; r < max_m; ++r)
    gemv_bf16<Out>(x.get() + r * ldx, ldx, w.get(), ldw, single.get() + r * ldy, ldy, 1, n, k,
                   nullptr);
  const auto one = single.download();
  // The reference on the dense (unpadded) operands.
  Vec xd, wd;
  for (int64_t r = 0; r < max_m; ++r)
    for (int64_t c = 0; c < k; ++c) xd.push_back(to_float(xh[r * ldx + c]));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) wd.push_back(to_float(wh[r * ldw + c]));
  for (int64_t m = 1; m <= max_m; ++m) {
    DeviceBuffer<Out> y(m * ldy);
    gemv_bf16<Out>(x.get(), ldx, w.get(), ldw, y.get(), ldy, m, n, k, nullptr);
    const auto got = y.download();
    std::vector<Out> dense;
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) {
        dense.push_back(got[r * ldy + c]);
        // note: exact equality with the 1-row call, element by element (the
        // padding columns of y are not outputs).
        ASSERT_TRUE(bitwise_equal(&got[r * ldy + c], &one[r * ldy + c], 1))
            << "n " << n << " k " << k << " m " << m << " row " << r << " col " << c;
      }
    const Vec ref = matmul_ref(Vec(xd.begin(), xd.begin() + m * k), wd, m, n, k);
    // note: bf16 products are exact in f32, so the error is the f32
    // accumulation over k (plus the output's rounding, 2^-9, for bf16).
    EXPECT_LT(rel_error(dense, ref), (std::is_same_v<Out, bf16> ? 1e-2 : 1e-5))
        << "n " << n << " k " << k << " m " << m;
  }
}

TEST(Gemv, F32OutMatchesReferenceAndRowsAreInvariant) {
  for (const auto& [n, k] :
       {std::pair<int64_t, int64_t>{37, 8}, {1000, 136}, {64, 1000}, {16, 24}, {300, 2056}})
    check_gemv<float>(n, k);
}

TEST(Gemv, Bf16OutMatchesReferenceAndRowsAreInvariant) {
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{1024, 3072}, {45, 136}})
    check_gemv<bf16>(n, k);
}

TEST(Gemv, SupportedShapes) {
  DeviceBuffer<bf16> a(4096);
  EXPECT_TRUE(gemv_bf16_supported(a.get(), 64, a.get(), 64, 1, 64));
  EXPECT_TRUE(gemv_bf16_supported(a.get(), 64, a.get(), 64, kGemvMaxM, 64));
  EXPECT_FALSE(gemv_bf16_supported(a.get(), 64, a.get(), 64, kGemvMaxM + 1, 64));
  EXPECT_FALSE(gemv_bf16_supported(a.get(), 64, a.get(), 64, 0, 64));
  EXPECT_FALSE(gemv_bf16_supported(a.get(), 64, a.get(), 64, 1, 60));      // k % 8
  EXPECT_FALSE(gemv_bf16_supported(a.get(), 63, a.get(), 64, 1, 56));      // ldx % 8
  EXPECT_FALSE(gemv_bf16_supported(a.get() + 1, 64, a.get(), 64, 1, 64));  // alignment
  EXPECT_THROW(gemv_bf16<float>(a.get(), 64, a.get(), 64, nullptr, 64, 1, 8, 60, nullptr),
               std::exception);
}

}  // namespace
}  // namespace qtk::cuda::test
