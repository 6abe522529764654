// The skinny tensor-core product (kernels/cuda/gemv_mma.h): against the
// float64 reference on awkward sizes and padded strides, and row invariance:
// row r of an m-row call (either token-tile variant, any warps per block)
// is bitwise equal to the 1-row call of row r.
#include <type_traits>
#include <utility>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/gemv_mma.h"
#include "tests/cuda/gpu_test_util.h"
#include "tests/cuda/reference.h"

namespace qtk::cuda::test {
namespace {

// The first cols values of each of rows rows of stride ld, as doubles.
template <class T>
Vec dense_of(const std::vector<T>& h, int64_t rows, int64_t cols, int64_t ld) {
  Vec v;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) v.push_back(to_float(h[r * ld + c]));
  return v;
}

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
  const Vec xd = dense_of(xh, max_m, k, ldx), wd = dense_of(wh, n, k, ldw);
  for (int64_t m = 1; m <= max_m; ++m) {
    DeviceBuffer<Out> y(m * ldy);
    gemv_bf16<Out>(x.get(), ldx, w.get(), ldw, y.get(), ldy, m, n, k, nullptr);
    const auto got = y.download();
    // note: the warps-per-block variants split the same chains differently
    // over blocks: every bit must be the same.
    for (const int warps : {1, 4}) {
      DeviceBuffer<Out> yv(m * ldy);
      gemv_bf16<Out>(x.get(), ldx, w.get(), ldw, yv.get(), ldy, m, n, k, nullptr, warps);
      const auto gv = yv.download();
      for (int64_t r = 0; r < m; ++r)
        ASSERT_TRUE(bitwise_equal(&gv[r * ldy], &got[r * ldy], n))
            << "n " << n << " k " << k << " m " << m << " row " << r << " warps " << warps;
    }
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

// The plain product on fewer blocks than row groups (each block taking
// several groups in turn, its ring running on across them): the same bits
// as one block per group, for awkward N (a partial last group, groups not
// a multiple of the blocks) and K (a partial last stage, one stage), and
// the automatic grid of a vocabulary-wide product against the reference.
template <class Out>
void check_gemv_groups(int64_t n, int64_t k, int64_t m) {
  const int64_t ldx = k + 8, ldw = k + 16, ldy = n + 3;
  const auto xh = to_device_type<bf16>(random_floats(m * ldx, -1, 1, 101));
  const auto wh = to_device_type<bf16>(random_floats(n * ldw, -1, 1, 102));
  DeviceBuffer<bf16> x(xh), w(wh);
  struct Reset {  // the launch's own choice again when the test ends, however it ends
    ~Reset() { set_gemv_grid_limit(0); }
  } reset;
  DeviceBuffer<Out> whole(m * ldy);
  set_gemv_grid_limit(-1);  // a block per group of 32 rows
  gemv_bf16<Out>(x.get(), ldx, w.get(), ldw, whole.get(), ldy, m, n, k, nullptr);
  const auto want = whole.download();
  // (the group count: a block per group in the form that takes groups in
  // turn; 0: the launch's own choice)
  for (const int blocks : {1, 3, 7, static_cast<int>((n + 31) / 32), 0}) {
    set_gemv_grid_limit(blocks);
    DeviceBuffer<Out> y(m * ldy);
    gemv_bf16<Out>(x.get(), ldx, w.get(), ldw, y.get(), ldy, m, n, k, nullptr);
    const auto got = y.download();
    for (int64_t r = 0; r < m; ++r)
      ASSERT_TRUE(bitwise_equal(&got[r * ldy], &want[r * ldy], n))
          << "n " << n << " k " << k << " m " << m << " blocks " << blocks << " row " << r;
  }
  std::vector<Out> dense;
  for (int64_t r = 0; r < m; ++r)
    dense.insert(dense.end(), want.begin() + r * ldy, want.begin() + r * ldy + n);
  const Vec ref = matmul_ref(dense_of(xh, m, k, ldx), dense_of(wh, n, k, ldw), m, n, k);
  EXPECT_LT(rel_error(dense, ref), (std::is_same_v<Out, bf16> ? 1e-2 : 1e-5)) << "n " << n;
}

TEST(Gemv, RowGroupsTakenInTurnGiveTheSameBits) {
  check_gemv_groups<float>(1000, 1000, 1);
  check_gemv_groups<float>(37, 136, 3);
  check_gemv_groups<bf16>(301, 128, 9);
  check_gemv_groups<bf16>(250, 2056, 16);
  // Far more groups than fit the GPU at once: the automatic grid takes them in turn.
  check_gemv_groups<float>(151936, 64, 1);
}

// The fused add + RMSNorm's input over rows of stride ld.
AddRmsNormInput rmsnorm_input(const bf16* residual, const bf16* delta, const float* weight,
                              float eps, bf16* residual_out, int64_t ld) {
  AddRmsNormInput an;
  an.residual = residual;
  an.ldr = ld;
  an.delta = delta;
  an.ldd = ld;
  an.weight = weight;
  an.eps = eps;
  an.residual_out = residual_out;
  an.ldo = ld;
  return an;
}

// The fused add + RMSNorm + product against its two steps, add_rmsnorm then
// gemv_bf16: the same bits in y and in the new residual, for every m, with
// padded strides.
template <class Out>
void check_add_rmsnorm_gemv(int64_t n, int64_t k) {
  const int64_t ld = k + 8, ldw = k + 16, ldy = n + 3, max_m = kGemvMaxM;
  const float eps = 1e-6f;
  const auto res_h = to_device_type<bf16>(random_floats(max_m * ld, -2, 2, 71));
  const auto delta_h = to_device_type<bf16>(random_floats(max_m * ld, -2, 2, 72));
  DeviceBuffer<bf16> delta(delta_h), w(to_device_type<bf16>(random_floats(n * ldw, -1, 1, 73)));
  DeviceBuffer<float> norm_w(random_floats(k, 0.5f, 1.5f, 74));
  for (int64_t m = 1; m <= max_m; ++m) {
    // The two steps: add_rmsnorm in place on a copy of the residual, then the product.
    DeviceBuffer<bf16> res_two(res_h), normed(m * ld);
    add_rmsnorm<bf16>(res_two.get(), ld, delta.get(), ld, norm_w.get(), normed.get(), ld, m, k, eps,
                      nullptr);
    DeviceBuffer<Out> y_two(m * ldy);
    gemv_bf16<Out>(normed.get(), ld, w.get(), ldw, y_two.get(), ldy, m, n, k, nullptr);
    const auto want_y = y_two.download();
    const auto want_res = res_two.download();
    DeviceBuffer<bf16> res(res_h), res_out(max_m * ld);
    const AddRmsNormInput an =
        rmsnorm_input(res.get(), delta.get(), norm_w.get(), eps, res_out.get(), ld);
    ASSERT_TRUE(add_rmsnorm_gemv_supported(an, w.get(), ldw, m, k));
    DeviceBuffer<Out> y(m * ldy);
    add_rmsnorm_gemv_bf16<Out>(an, w.get(), ldw, y.get(), ldy, m, n, k, nullptr);
    const auto got_y = y.download();
    const auto got_res = res_out.download();
    for (int64_t r = 0; r < m; ++r) {
      ASSERT_TRUE(bitwise_equal(&got_y[r * ldy], &want_y[r * ldy], n))
          << "y: n " << n << " k " << k << " m " << m << " row " << r;
      ASSERT_TRUE(bitwise_equal(&got_res[r * ld], &want_res[r * ld], k))
          << "residual: n " << n << " k " << k << " m " << m << " row " << r;
    }
    // The old residual is only read.
    ASSERT_TRUE(bitwise_equal(res.download().data(), res_h.data(), res_h.size()));
  }
}

TEST(Gemv, AddRmsNormFusedEqualsTheTwoSteps) {
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{37, 8}, {300, 1000}, {64, 2056}})
    check_add_rmsnorm_gemv<float>(n, k);
  check_add_rmsnorm_gemv<bf16>(1024, 1024);
}

// The gate_up product with the SwiGLU as its epilogue against the product
// into a gate_up buffer, then swiglu; behind the fused add + RMSNorm too
// (against add_rmsnorm, the product and swiglu). inter not a multiple of 4:
// a warp's last activation columns fall past the end.
void check_swiglu_out(int64_t inter, int64_t k) {
  const int64_t ld = k + 8, ldw = k + 16, ldg = 2 * inter + 5, lda = inter + 3;
  const int64_t max_m = kGemvMaxM;
  const float eps = 1e-6f;
  const auto x_h = to_device_type<bf16>(random_floats(max_m * ld, -2, 2, 91));
  const auto delta_h = to_device_type<bf16>(random_floats(max_m * ld, -2, 2, 92));
  DeviceBuffer<bf16> x(x_h), delta(delta_h);
  DeviceBuffer<bf16> w(to_device_type<bf16>(random_floats(2 * inter * ldw, -1, 1, 93)));
  DeviceBuffer<float> norm_w(random_floats(k, 0.5f, 1.5f, 94));
  for (int64_t m = 1; m <= max_m; ++m) {
    // Plain: x -> gate_up -> swiglu.
    DeviceBuffer<bf16> gate_up(m * ldg), want(m * lda), got(m * lda);
    gemv_bf16<bf16>(x.get(), ld, w.get(), ldw, gate_up.get(), ldg, m, 2 * inter, k, nullptr);
    swiglu<bf16>(gate_up.get(), ldg, want.get(), lda, m, inter, nullptr);
    gemv_swiglu_out_bf16(x.get(), ld, w.get(), ldw, got.get(), lda, m, inter, k, nullptr);
    const auto a = got.download(), b = want.download();
    for (int64_t r = 0; r < m; ++r)
      ASSERT_TRUE(bitwise_equal(&a[r * lda], &b[r * lda], inter))
          << "plain: inter " << inter << " k " << k << " m " << m << " row " << r;
    // Behind add + RMSNorm: x is the residual.
    DeviceBuffer<bf16> res_two(x_h), normed(m * ld), want2(m * lda), got2(m * lda);
    add_rmsnorm<bf16>(res_two.get(), ld, delta.get(), ld, norm_w.get(), normed.get(), ld, m, k, eps,
                      nullptr);
    gemv_bf16<bf16>(normed.get(), ld, w.get(), ldw, gate_up.get(), ldg, m, 2 * inter, k, nullptr);
    swiglu<bf16>(gate_up.get(), ldg, want2.get(), lda, m, inter, nullptr);
    DeviceBuffer<bf16> res_out(max_m * ld);
    const AddRmsNormInput an =
        rmsnorm_input(x.get(), delta.get(), norm_w.get(), eps, res_out.get(), ld);
    add_rmsnorm_gemv_swiglu_out_bf16(an, w.get(), ldw, got2.get(), lda, m, inter, k, nullptr);
    const auto c = got2.download(), d = want2.download();
    const auto ro = res_out.download(), rt = res_two.download();
    for (int64_t r = 0; r < m; ++r) {
      ASSERT_TRUE(bitwise_equal(&c[r * lda], &d[r * lda], inter))
          << "fused: inter " << inter << " k " << k << " m " << m << " row " << r;
      ASSERT_TRUE(bitwise_equal(&ro[r * ld], &rt[r * ld], k))
          << "residual: inter " << inter << " k " << k << " m " << m << " row " << r;
    }
  }
}

TEST(Gemv, SwigluEpilogueEqualsProductThenSwiglu) {
  for (const auto& [inter, k] : {std::pair<int64_t, int64_t>{37, 8}, {301, 1000}, {3072, 1024}})
    check_swiglu_out(inter, k);
}

// K slices: the sliced product against its definition, the f32 products of
// each K slice (one chain each, the unsliced kernel on the slice) added in
// slice order by slice_sum; rows alone vs in m-row calls; the float64
// reference; and the fused add + RMSNorm in front against its two steps.
template <class Out>
void check_sliced(int64_t n, int64_t k) {
  constexpr int S = kGemvSlices;
  ASSERT_TRUE(gemv_slices_supported(k, S)) << k;
  const int64_t ld = k + 8, ldw = k + 16, ldy = n + 3, max_m = kGemvMaxM, klen = k / S;
  const float eps = 1e-6f;
  const auto xh = to_device_type<bf16>(random_floats(max_m * ld, -1, 1, 81));
  const auto wh = to_device_type<bf16>(random_floats(n * ldw, -1, 1, 82));
  const auto delta_h = to_device_type<bf16>(random_floats(max_m * ld, -2, 2, 83));
  DeviceBuffer<bf16> x(xh), w(wh), delta(delta_h);
  DeviceBuffer<float> norm_w(random_floats(k, 0.5f, 1.5f, 84));
  DeviceBuffer<Out> single(max_m * ldy);
  for (int64_t r = 0; r < max_m; ++r)
    gemv_bf16<Out>(x.get() + r * ld, ld, w.get(), ldw, single.get() + r * ldy, ldy, 1, n, k,
                   nullptr, 0, S);
  const auto one = single.download();
  const Vec xd = dense_of(xh, max_m, k, ld), wd = dense_of(wh, n, k, ldw);
  for (const int64_t m : {int64_t{1}, int64_t{3}, int64_t{8}, int64_t{9}, max_m}) {
    DeviceBuffer<Out> y(m * ldy), want(m * ldy);
    gemv_bf16<Out>(x.get(), ld, w.get(), ldw, y.get(), ldy, m, n, k, nullptr, 0, S);
    DeviceBuffer<float> parts(S * m * n);
    for (int s = 0; s < S; ++s)
      gemv_bf16<float>(x.get() + s * klen, ld, w.get() + s * klen, ldw, parts.get() + s * m * n, n,
                       m, n, klen, nullptr);
    slice_sum<Out>(parts.get(), S, m * n, want.get(), ldy, m, n, nullptr);
    const auto got = y.download(), def = want.download();
    std::vector<Out> dense;
    for (int64_t r = 0; r < m; ++r) {
      ASSERT_TRUE(bitwise_equal(&got[r * ldy], &def[r * ldy], n))
          << "vs the slice sums: n " << n << " k " << k << " m " << m << " row " << r;
      ASSERT_TRUE(bitwise_equal(&got[r * ldy], &one[r * ldy], n))
          << "vs the row alone: n " << n << " k " << k << " m " << m << " row " << r;
      dense.insert(dense.end(), got.begin() + r * ldy, got.begin() + r * ldy + n);
    }
    const Vec ref = matmul_ref(Vec(xd.begin(), xd.begin() + m * k), wd, m, n, k);
    EXPECT_LT(rel_error(dense, ref), (std::is_same_v<Out, bf16> ? 1e-2 : 1e-5))
        << "n " << n << " k " << k << " m " << m;
    // The fused add + RMSNorm in front (x as the residual).
    DeviceBuffer<bf16> res_two(xh), normed(m * ld), res_out(max_m * ld);
    add_rmsnorm<bf16>(res_two.get(), ld, delta.get(), ld, norm_w.get(), normed.get(), ld, m, k, eps,
                      nullptr);
    gemv_bf16<Out>(normed.get(), ld, w.get(), ldw, want.get(), ldy, m, n, k, nullptr, 0, S);
    const AddRmsNormInput an =
        rmsnorm_input(x.get(), delta.get(), norm_w.get(), eps, res_out.get(), ld);
    ASSERT_TRUE(add_rmsnorm_gemv_supported(an, w.get(), ldw, m, k));
    add_rmsnorm_gemv_bf16<Out>(an, w.get(), ldw, y.get(), ldy, m, n, k, nullptr, S);
    const auto fused = y.download(), two = want.download();
    for (int64_t r = 0; r < m; ++r)
      ASSERT_TRUE(bitwise_equal(&fused[r * ldy], &two[r * ldy], n))
          << "fused: n " << n << " k " << k << " m " << m << " row " << r;
  }
}

TEST(Gemv, KSlicesAreTheSliceSumsInOrder) {
  check_sliced<bf16>(1024, 3072);
  check_sliced<bf16>(45, 2048);
  check_sliced<float>(301, 512);
  EXPECT_FALSE(gemv_slices_supported(1000, kGemvSlices));  // not a multiple of 512
  EXPECT_FALSE(gemv_slices_supported(2048, 2));
  EXPECT_TRUE(gemv_slices_supported(1000, 1));
  DeviceBuffer<bf16> a(4096);
  EXPECT_THROW(
      gemv_bf16<float>(a.get(), 64, a.get(), 64, nullptr, 64, 1, 8, 64, nullptr, 0, kGemvSlices),
      std::exception);  // k 64: no 4 slices of whole stages
}

// slice_sum alone: the slices added in order, as f32 and rounded to bf16,
// on an odd width (the one-column form) and a multiple of 4 (float4).
TEST(Gemv, SliceSumAddsInSliceOrder) {
  for (const int64_t n : {int64_t{37}, int64_t{64}}) {
    const int64_t m = 5, ldy = n + 1;
    const int S = 4;
    const auto ph = random_floats(S * m * n, -1e3f, 1e3f, 85);
    DeviceBuffer<float> parts(ph), yf(m * ldy);
    DeviceBuffer<bf16> yb(m * ldy);
    slice_sum<float>(parts.get(), S, m * n, yf.get(), ldy, m, n, nullptr);
    slice_sum<bf16>(parts.get(), S, m * n, yb.get(), ldy, m, n, nullptr);
    const auto gf = yf.download();
    const auto gb = yb.download();
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) {
        float v = ph[r * n + c];
        for (int s = 1; s < S; ++s) v = v + ph[s * m * n + r * n + c];
        ASSERT_TRUE(bitwise_equal(&gf[r * ldy + c], &v, 1))
            << "n " << n << " r " << r << " c " << c;
        const bf16 vb = to_device_type<bf16>(std::vector<float>{v})[0];
        ASSERT_TRUE(bitwise_equal(&gb[r * ldy + c], &vb, 1))
            << "n " << n << " r " << r << " c " << c;
      }
  }
}

TEST(Gemv, AddRmsNormNeedsADistinctResidualOut) {
  DeviceBuffer<bf16> a(4096), w(4096);
  DeviceBuffer<float> nw(64);
  AddRmsNormInput an;
  an.residual = a.get();
  an.ldr = 64;
  an.delta = a.get() + 2048;
  an.ldd = 64;
  an.weight = nw.get();
  an.residual_out = a.get() + 512;
  an.ldo = 64;
  EXPECT_TRUE(add_rmsnorm_gemv_supported(an, w.get(), 64, 4, 64));
  EXPECT_FALSE(add_rmsnorm_gemv_supported(an, w.get(), 64, 16, 64));  // rows overlap
  an.residual_out = a.get();
  EXPECT_FALSE(add_rmsnorm_gemv_supported(an, w.get(), 64, 1, 64));
  EXPECT_THROW(add_rmsnorm_gemv_bf16<float>(an, w.get(), 64, nullptr, 64, 1, 8, 64, nullptr),
               std::exception);
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
  EXPECT_THROW(gemv_bf16<float>(a.get(), 64, a.get(), 64, nullptr, 64, 1, 8, 64, nullptr, 3),
               std::exception);
}

}  // namespace
}  // namespace qtk::cuda::test
