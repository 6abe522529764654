// warp_matmul (kernels/cuda/warp_matmul.h): dense and block-FP8 weights
// against float64 references on awkward sizes (partial scale blocks,
// K not a multiple of the vector width), and its batch invariance; then its
// tensor-core form for bf16 activations (MmaMatmul.*).
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tuning.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/warp_matmul.h"
#include "tests/cuda/gpu_test_util.h"

namespace qtk::cuda::test {
namespace {

using Vec = std::vector<double>;

// e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities,
// 0x7F / 0xFF are NaN (never generated here).
double e4m3_value(uint8_t b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  const double v = e == 0 ? m / 8.0 * std::ldexp(1.0, -6) : (1 + m / 8.0) * std::ldexp(1.0, e - 7);
  return s ? -v : v;
}

std::vector<uint8_t> random_e4m3(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) {
    do b = static_cast<uint8_t>(rng() & 0xFF);
    while ((b & 0x7F) == 0x7F || ((b >> 3) & 15) > 9);  // no NaN, |w| <= 2^3
  }
  return v;
}

// One test operand: x [M, K], and either dense w [N, K] or e4m3 + scales.
template <class T>
struct Operands {
  int64_t M, N, K, br, bc;
  bool fp8;
  std::vector<T> x, wd;
  std::vector<uint8_t> wq;
  std::vector<float> scale;

  Operands(int64_t m, int64_t n, int64_t k, bool f8, int64_t brows, int64_t bcols, uint32_t seed)
      : M(m), N(n), K(k), br(brows), bc(bcols), fp8(f8) {
    x = to_device_type<T>(random_floats(M * K, -1, 1, seed));
    if (fp8) {
      wq = random_e4m3(N * K, seed + 1);
      scale = random_floats(((N + br - 1) / br) * ((K + bc - 1) / bc), 0.01f, 0.1f, seed + 2);
    } else {
      wd = to_device_type<T>(random_floats(N * K, -0.5f, 0.5f, seed + 1));
    }
  }
  double w(int64_t n, int64_t k) const {
    if (!fp8) return to_float(wd[n * K + k]);
    // The kernel's weight: the e4m3 value times its scale, rounded to f32.
    const float s = scale[(n / br) * ((K + bc - 1) / bc) + k / bc];
    return static_cast<float>(static_cast<float>(e4m3_value(wq[n * K + k])) * s);
  }
  Vec reference() const {
    Vec y(M * N, 0.0);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += double(to_float(x[m * K + k])) * w(n, k);
        y[m * N + n] = s;
      }
    return y;
  }
  // Rows [m0, m0 + rows) through the kernel.
  template <class Y>
  std::vector<Y> run(int64_t m0, int64_t rows) const {
    DeviceBuffer<T> xd(std::vector<T>(x.begin() + m0 * K, x.begin() + (m0 + rows) * K));
    DeviceBuffer<T> wdd(fp8 ? std::vector<T>(1) : wd);
    DeviceBuffer<uint8_t> wqd(fp8 ? wq : std::vector<uint8_t>(1));
    DeviceBuffer<float> sd(fp8 ? scale : std::vector<float>(1));
    DeviceBuffer<Y> y(rows * N);
    WeightRef<T> w;
    if (fp8) {
      w.fp8 = wqd.get();
      w.scale = sd.get();
      w.block_rows = br;
      w.block_cols = bc;
    } else {
      w.dense = wdd.get();
    }
    warp_matmul<T, Y>(xd.get(), K, w, y.get(), N, rows, N, K, nullptr);
    return y.download();
  }
};

template <class T>
class WarpMatmulTest : public ::testing::Test {};
using ActTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(WarpMatmulTest, ActTypes);

TYPED_TEST(WarpMatmulTest, DenseMatchesReference) {
  using T = TypeParam;
  for (int64_t M : {1, 3, 17, 130})
    for (int64_t N : {1, 7, 64})
      for (int64_t K : {5, 64, 264, 1000}) {
        const Operands<T> op(M, N, K, false, 0, 0, static_cast<uint32_t>(M * 1000 + N * 10 + K));
        EXPECT_LT(rel_error(op.template run<T>(0, M), op.reference()), tolerance<T>())
            << M << "x" << N << "x" << K;
        if constexpr (std::is_same_v<T, bf16>) {
          EXPECT_LT(rel_error(op.template run<float>(0, M), op.reference()), 1e-5)
              << M << "x" << N << "x" << K << " (f32 out)";
        }
      }
}

// note: f32 activations against the f32-rounded weights: the float32 sum
// stays within 1e-5 of the float64 one. 200 x 300 with 128 x 128 blocks has
// partial blocks on both edges; 16 x 16 blocks change scale every lane pair.
TYPED_TEST(WarpMatmulTest, Fp8MatchesReference) {
  using T = TypeParam;
  struct Shape {
    int64_t M, N, K, br, bc;
  };
  for (const Shape s : {Shape{1, 200, 300, 128, 128}, Shape{9, 64, 256, 16, 16},
                        Shape{33, 40, 100, 32, 48}, Shape{130, 7, 37, 128, 128}}) {
    const Operands<T> op(s.M, s.N, s.K, true, s.br, s.bc, static_cast<uint32_t>(s.M + s.K));
    EXPECT_LT(rel_error(op.template run<T>(0, s.M), op.reference()), tolerance<T>())
        << s.M << "x" << s.N << "x" << s.K << " blocks " << s.br << "x" << s.bc;
  }
}

TYPED_TEST(WarpMatmulTest, RowBitsDoNotDependOnTheBatch) {
  using T = TypeParam;
  for (const bool fp8 : {false, true}) {
    const int64_t M = 70, N = 48, K = 392;
    const Operands<T> op(M, N, K, fp8, 16, 128, 5);
    const std::vector<T> all = op.template run<T>(0, M);
    for (const int64_t m : {0, 8, 69}) {
      const std::vector<T> one = op.template run<T>(m, 1);
      EXPECT_TRUE(bitwise_equal(one.data(), all.data() + m * N, N))
          << "row " << m << " fp8 " << fp8;
    }
    const std::vector<T> part = op.template run<T>(3, 21);
    EXPECT_TRUE(bitwise_equal(part.data(), all.data() + 3 * N, 21 * N)) << "fp8 " << fp8;
  }
}

}  // namespace
}  // namespace qtk::cuda::test

namespace qtk::cuda::test {
namespace {

// The tensor-core form (kernels/cuda/mma_matmul.cuh) that warp_matmul takes
// with bf16 activations when K % 16 == 0 and the scale blocks hold whole
// 64-k chunks. Shapes: N not a multiple of 16 (rows past N), K with a
// partial 64-k chunk (48, 320, 1040), partial 128 x 128 scale blocks, fewer
// chunks than the block's 4 warps (K 48, 64), and row counts that take every
// pass width (8, 16, 32, 64 rows) and both kernel forms (up to 16 rows, more).
struct MmaShape {
  int64_t M, N, K, br, bc;
  bool fp8;
};
constexpr MmaShape kMmaShapes[] = {
    {1, 200, 320, 128, 128, true}, {37, 50, 256, 16, 64, true},    {130, 33, 448, 128, 128, true},
    {70, 16, 64, 128, 128, true},  {5, 300, 1040, 128, 192, true}, {1, 200, 320, 0, 0, false},
    {9, 64, 1024, 0, 0, false},    {130, 7, 48, 0, 0, false},      {17, 129, 2048, 0, 0, false},
};

bool compute_capability_90() {
  int device = 0;
  cudaDeviceProp p{};
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaGetDeviceProperties(&p, device) == cudaSuccess && p.major == 9 && p.minor == 0;
}

// Sets QTK_MMA_MATMUL (and QTK_MMA_WIDE, the form of more than 16 rows) for
// the scope (process-wide switches, core/tuning.h).
class MmaSwitch {
 public:
  explicit MmaSwitch(bool on, int wide = Tuning{}.mma_wide) : saved_(tuning()) {
    Tuning t = saved_;
    t.mma_matmul = on;
    t.mma_wide = wide;
    set_tuning(t);
  }
  ~MmaSwitch() { set_tuning(saved_); }

 private:
  Tuning saved_;
};

TEST(MmaMatmul, MatchesReference) {
  const MmaSwitch on(true);
  for (const MmaShape& s : kMmaShapes) {
    const Operands<bf16> op(s.M, s.N, s.K, s.fp8, s.br, s.bc,
                            static_cast<uint32_t>(s.M * 7 + s.K + s.fp8));
    const Vec ref = op.reference();
    EXPECT_LT(rel_error(op.run<bf16>(0, s.M), ref), tolerance<bf16>())
        << s.M << "x" << s.N << "x" << s.K << " fp8 " << s.fp8;
    // note: f32 outputs keep the f32 sums: bf16 products are exact, so only
    // the f32 accumulation and the scale's rounding of each block separate
    // them from float64.
    EXPECT_LT(rel_error(op.run<float>(0, s.M), ref), 1e-5)
        << s.M << "x" << s.N << "x" << s.K << " fp8 " << s.fp8 << " (f32 out)";
  }
}

// The switch picks another kernel: the tensor-core sums are not the warp
// product's (different order), so some output differs in its last bits
// while both stay within tolerance. This is how the tests know the
// tensor-core kernel ran at all.
TEST(MmaMatmul, IsTheKernelThatRuns) {
  for (const bool fp8 : {false, true}) {
    const Operands<bf16> op(64, 96, 512, fp8, 128, 128, 11);
    std::vector<float> mma, warp;
    {
      const MmaSwitch on(true);
      mma = op.run<float>(0, 64);
    }
    {
      const MmaSwitch off(false);
      warp = op.run<float>(0, 64);
    }
    EXPECT_FALSE(bitwise_equal(mma.data(), warp.data(), mma.size())) << "fp8 " << fp8;
    EXPECT_LT(rel_error(mma, op.reference()), 1e-5);
  }
}

// A row's bits alone (the narrow kernel) and among 150 (each form of more
// than 16 rows, QTK_MMA_WIDE: the 4-warp wide kernel, the split kernel's
// 32- and 64-row passes, the warpgroup kernel, the per-shape choice), for N
// past a whole 64-column block and K with a partial scale block and chunk
// ranges of 4 and 5 chunks.
TEST(MmaMatmul, RowBitsDoNotDependOnTheBatch) {
  for (const bool fp8 : {false, true})
    for (const int wide : {4, 32, 64, 90, 0}) {
      const MmaSwitch on(true, wide);
      const int64_t M = 150, N = 70, K = 1088;
      // The forced form is the one that runs (90 where the GPU has wgmma,
      // compute capability 9.0; the per-shape choice elsewhere).
      const int form = mma_wide_form(N, M, false, fp8);
      if (wide == 90 && !compute_capability_90()) {
        EXPECT_NE(form, 90);
      } else if (wide != 0) {
        EXPECT_EQ(form, wide == 4 ? 0 : wide);
      }
      const Operands<bf16> op(M, N, K, fp8, 128, 128, 23);
      const std::vector<bf16> all = op.run<bf16>(0, M);
      EXPECT_LT(rel_error(all, op.reference()), tolerance<bf16>())
          << "fp8 " << fp8 << " wide " << wide;
      for (const int64_t m : {0, 7, 63, 64, 149}) {
        const std::vector<bf16> one = op.run<bf16>(m, 1);
        EXPECT_TRUE(bitwise_equal(one.data(), all.data() + m * N, N))
            << "row " << m << " fp8 " << fp8 << " wide " << wide;
      }
      struct Part {
        int64_t m0, rows;
      };
      for (const Part p : {Part{5, 40}, Part{10, 17}, Part{100, 9}, Part{1, 100}}) {
        const std::vector<bf16> part = op.run<bf16>(p.m0, p.rows);
        EXPECT_TRUE(bitwise_equal(part.data(), all.data() + p.m0 * N, p.rows * N))
            << "rows " << p.m0 << ".." << p.m0 + p.rows - 1 << " fp8 " << fp8 << " wide " << wide;
      }
    }
}

// The warpgroup kernel (QTK_MMA_WIDE=90) against the split kernel (64-row
// passes) and rows alone (the narrow kernel), bit for bit, in bf16 and f32
// outputs, on the shapes of kMmaShapes with more than 16 rows and a few
// more: a partial last chunk (K 1040, 48), fewer chunks than ranges (K 48,
// 64: empty ranges), scale blocks of 1 and 3 chunks (bc 64, 192) and 16
// rows (br 16, where each output column block has 8 scale rows), N past
// one and two 128-column blocks (129, 300) and within one, one-warpgroup
// passes (17 to 64 rows) and two-warpgroup passes (more), full and
// partial.
TEST(MmaMatmul, WarpgroupFormGivesTheOtherFormsBits) {
  constexpr MmaShape kShapes[] = {
      {37, 50, 256, 16, 64, true},      {130, 33, 448, 128, 128, true},
      {70, 16, 64, 128, 128, true},     {65, 300, 1040, 128, 192, true},
      {200, 129, 2048, 128, 128, true}, {130, 7, 48, 0, 0, false},
      {17, 129, 2048, 0, 0, false},     {150, 70, 1088, 0, 0, false},
  };
  for (const MmaShape& s : kShapes) {
    const Operands<bf16> op(s.M, s.N, s.K, s.fp8, s.br, s.bc,
                            static_cast<uint32_t>(s.M * 5 + s.K + s.fp8));
    const std::string what = std::to_string(s.M) + "x" + std::to_string(s.N) + "x" +
                             std::to_string(s.K) + " fp8 " + std::to_string(s.fp8);
    std::vector<bf16> wg, split;
    std::vector<float> wg32, split32;
    {
      const MmaSwitch on(true, 90);
      if (compute_capability_90()) {
        EXPECT_EQ(mma_wide_form(s.N, s.M, false, s.fp8), 90) << what;
      }
      wg = op.run<bf16>(0, s.M);
      wg32 = op.run<float>(0, s.M);
    }
    {
      const MmaSwitch on(true, 64);
      split = op.run<bf16>(0, s.M);
      split32 = op.run<float>(0, s.M);
    }
    EXPECT_LT(rel_error(wg, op.reference()), tolerance<bf16>()) << what;
    EXPECT_TRUE(bitwise_equal(wg.data(), split.data(), wg.size())) << what;
    EXPECT_TRUE(bitwise_equal(wg32.data(), split32.data(), wg32.size())) << what << " (f32 out)";
    const MmaSwitch on(true, 90);
    for (const int64_t m : {int64_t{0}, s.M / 2, s.M - 1}) {
      const std::vector<float> one = op.run<float>(m, 1);
      EXPECT_TRUE(bitwise_equal(one.data(), wg32.data() + m * s.N, s.N)) << what << " row " << m;
    }
  }
}

// warp_matmul_swiglu: the product with a [2I, K] gate-over-up weight and
// the SwiGLU in one launch give the bits of warp_matmul then swiglu, for
// I not a multiple of the block's 8 columns, partial chunks and scale
// blocks, both kernel passes (8 and 16 rows); above 16 rows it declines.
TEST(MmaMatmul, SwigluInOneLaunchMatchesTwoSteps) {
  const MmaSwitch on(true);
  for (const bool fp8 : {false, true})
    for (const int64_t I : {40, 200})
      for (const int64_t M : {1, 5, 12, 16, 17}) {
        const int64_t K = 1088;
        const Operands<bf16> op(M, 2 * I, K, fp8, 128, 128, static_cast<uint32_t>(I + M));
        DeviceBuffer<bf16> xd(op.x), wdd(fp8 ? std::vector<bf16>(1) : op.wd);
        DeviceBuffer<uint8_t> wqd(fp8 ? op.wq : std::vector<uint8_t>(1));
        DeviceBuffer<float> sd(fp8 ? op.scale : std::vector<float>(1));
        WeightRef<bf16> w;
        if (fp8) {
          w.fp8 = wqd.get();
          w.scale = sd.get();
          w.block_rows = 128;
          w.block_cols = 128;
        } else {
          w.dense = wdd.get();
        }
        DeviceBuffer<bf16> y(M * 2 * I), two(M * I), one(M * I);
        warp_matmul<bf16, bf16>(xd.get(), K, w, y.get(), 2 * I, M, 2 * I, K, nullptr);
        swiglu<bf16>(y.get(), 2 * I, two.get(), I, M, I, nullptr);
        const bool ran = warp_matmul_swiglu<bf16>(xd.get(), K, w, one.get(), I, M, I, K, nullptr);
        EXPECT_EQ(ran, M <= 16) << M << " rows";
        if (!ran) continue;
        const auto a = one.download(), b = two.download();
        EXPECT_TRUE(bitwise_equal(a.data(), b.data(), a.size()))
            << M << " rows, I " << I << " fp8 " << fp8;
      }
}

}  // namespace
}  // namespace qtk::cuda::test
