// FP8 (e4m3 + float32 block scales) matmul: against a float64 reference on
// awkward sizes with partial blocks, bit for bit against the f32-weight
// matmul of the dequantized weights on every path, and batch invariance.
#include "kernels/matmul_fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/matmul.h"
#include "tests/kernels/test_util.h"

namespace qtk {
namespace {

struct Fp8Weight {
  int64_t N, K, br, bc;
  std::vector<uint8_t> q;    // e4m3 [N, K]
  std::vector<float> scale;  // f32 [ceil(N/br), ceil(K/bc)]
  int64_t sld() const { return (K + bc - 1) / bc; }
  float s(int64_t n, int64_t k) const { return scale[(n / br) * sld() + k / bc]; }
  // The weight as the kernels define it: one float32 product.
  float w32(int64_t n, int64_t k) const { return fp8_e4m3_to_f32(q[n * K + k]) * s(n, k); }
};

// Random bytes (every finite e4m3 value, NaN bytes 0x7F/0xFF excluded),
// scales of random sign and magnitude 2^-14..2^-4, or up to 2^12 with
// `big` (the kernels' two-multiply decode).
Fp8Weight make_weight(int64_t N, int64_t K, int64_t br, int64_t bc, uint32_t seed, bool big) {
  Fp8Weight w{N, K, br, bc, {}, {}};
  std::mt19937 rng(seed);
  w.q.resize(static_cast<size_t>(N * K));
  for (auto& b : w.q) {
    do {
      b = static_cast<uint8_t>(rng() & 0xFF);
    } while ((b & 0x7F) == 0x7F);
  }
  std::uniform_real_distribution<float> e(big ? -2.0f : -14.0f, big ? 12.0f : -4.0f);
  w.scale.resize(static_cast<size_t>(((N + br - 1) / br) * w.sld()));
  for (auto& s : w.scale) s = std::exp2(e(rng)) * ((rng() & 1) ? -1.0f : 1.0f);
  return w;
}

std::string label(CpuPath p, int64_t M, const Fp8Weight& w) {
  return std::string(cpu_path_name(p)) + " M=" + std::to_string(M) + " N=" + std::to_string(w.N) +
         " K=" + std::to_string(w.K) + " block=[" + std::to_string(w.br) + "," +
         std::to_string(w.bc) + "]";
}

TEST(Fp8Decode, KnownValues) {
  EXPECT_EQ(fp8_e4m3_to_f32(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(fp8_e4m3_to_f32(0x80)));
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0xB8), -1.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x7E), 448.0f);                // largest finite
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_f32(0x07), 7.0f * std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8_e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(fp8_e4m3_to_f32(0x3F), 1.875f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0xFF)));
}

struct Shape {
  int64_t M, N, K, br, bc;
};

// note: partial blocks in both directions (N, K not multiples of the block),
// K tails inside a vector, row blocks smaller than a register tile (br 1, 7)
// and narrow column blocks (bc 16, 48).
const Shape kShapes[] = {{1, 1, 1, 128, 128},     {3, 17, 17, 128, 128},   {1, 130, 257, 128, 128},
                         {5, 200, 300, 128, 128}, {17, 63, 130, 64, 128},  {4, 33, 100, 7, 16},
                         {9, 45, 320, 1, 48},     {2, 320, 256, 128, 128}, {6, 13, 1000, 128, 128}};

TEST(MatmulFp8, MatchesFloat64ReferenceOnAwkwardSizesEveryPath) {
  ThreadPool pool(2);
  for (CpuPath path : supported_cpu_paths()) {
    for (bool big : {false, true}) {
      for (const Shape& sh : kShapes) {
        const Fp8Weight w = make_weight(sh.N, sh.K, sh.br, sh.bc, 7 + sh.N * 3 + sh.K, big);
        const int64_t ldx = sh.K + 3, ldy = sh.N + 5;
        auto x = test::random_floats(sh.M * ldx, 11 + sh.M + sh.K);
        std::vector<float> y(sh.M * ldy, -1.0f);
        matmul_fp8_on_path(path, x.data(), ldx, w.q.data(), w.scale.data(), w.br, w.bc, y.data(),
                           ldy, sh.M, sh.N, sh.K, &pool);
        for (int64_t m = 0; m < sh.M; ++m) {
          for (int64_t n = 0; n < sh.N; ++n) {
            double exact = 0.0, abs_sum = 0.0;
            for (int64_t k = 0; k < sh.K; ++k) {
              const double t = static_cast<double>(x[m * ldx + k]) *
                               fp8_e4m3_to_f32(w.q[n * sh.K + k]) * w.s(n, k);
              exact += t;
              abs_sum += std::fabs(t);
            }
            // note: f32 summation (Higham: gamma_K * sum|x*w|, K ~ the
            // chain length bound) plus the weight's own float32 rounding
            // (relative 2^-24) and the product's: K + 4 units of 2^-24.
            const double tol = (sh.K + 4) * std::ldexp(1.0, -24) * abs_sum + 1e-30;
            ASSERT_NEAR(y[m * ldy + n], exact, tol)
                << label(path, sh.M, w) << " at " << m << "," << n << (big ? " big scales" : "");
          }
          for (int64_t n = sh.N; n < ldy; ++n) ASSERT_EQ(y[m * ldy + n], -1.0f);
        }
      }
    }
  }
}

// The contract that makes an FP8 pack and its `convert --dtype f32` pack give
// the same tokens: same bits as matmul() with the float32 products as weights.
TEST(MatmulFp8, BitEqualToF32MatmulOfDequantizedWeightsEveryPath) {
  ThreadPool pool(3);
  for (CpuPath path : supported_cpu_paths()) {
    for (bool big : {false, true}) {
      for (const Shape& sh : kShapes) {
        const Fp8Weight w = make_weight(sh.N, sh.K, sh.br, sh.bc, 99 + sh.N + sh.K * 5, big);
        std::vector<float> w32(static_cast<size_t>(sh.N * sh.K));
        for (int64_t n = 0; n < sh.N; ++n)
          for (int64_t k = 0; k < sh.K; ++k) w32[n * sh.K + k] = w.w32(n, k);
        auto x = test::random_floats(sh.M * sh.K, 5 + sh.M * sh.K);
        // some exact zeros and negative zeros in x, where signed-zero
        // handling would show
        for (size_t i = 0; i < x.size(); i += 7) x[i] = (i % 2) ? 0.0f : -0.0f;
        std::vector<float> y(sh.M * sh.N), y32(sh.M * sh.N);
        matmul_fp8_on_path(path, x.data(), sh.K, w.q.data(), w.scale.data(), w.br, w.bc, y.data(),
                           sh.N, sh.M, sh.N, sh.K, &pool);
        matmul_on_path(path == CpuPath::kAmx ? CpuPath::kAvx512 : path, x.data(), sh.K, w32.data(),
                       DType::F32, y32.data(), sh.N, sh.M, sh.N, sh.K, &pool);
        ASSERT_TRUE(test::bit_equal(y.data(), y32.data(), y.size()))
            << label(path, sh.M, w) << (big ? " big scales" : "");
      }
    }
  }
}

// Row m of an M-row call is the same bits as that row alone, for any thread
// count: decode (M = 1) and prefill batches agree.
TEST(MatmulFp8, RowsDoNotDependOnBatchOrThreads) {
  ThreadPool pool1(1), pool3(3);
  const int64_t N = 130, K = 300;
  const Fp8Weight w = make_weight(N, K, 64, 128, 1234, false);
  const int64_t Mmax = 37;
  auto x = test::random_floats(Mmax * K, 77);
  for (CpuPath path : supported_cpu_paths()) {
    std::vector<float> alone(Mmax * N);
    for (int64_t m = 0; m < Mmax; ++m)
      matmul_fp8_on_path(path, x.data() + m * K, K, w.q.data(), w.scale.data(), w.br, w.bc,
                         alone.data() + m * N, N, 1, N, K, &pool1);
    for (int64_t M : {2, 3, 4, 5, 8, 9, 17, 37}) {
      std::vector<float> y(M * N);
      matmul_fp8_on_path(path, x.data(), K, w.q.data(), w.scale.data(), w.br, w.bc, y.data(), N, M,
                         N, K, &pool3);
      ASSERT_TRUE(test::bit_equal(y.data(), alone.data(), y.size()))
          << cpu_path_name(path) << " M=" << M;
    }
  }
}

TEST(MatmulFp8, NanByteGivesNanEveryPath) {
  const int64_t N = 3, K = 40;
  Fp8Weight w = make_weight(N, K, 128, 16, 5, false);
  w.q[1 * K + 33] = 0x7F;  // row 1, in the K tail of the avx paths' vectors
  w.q[2 * K + 2] = 0xFF;
  auto x = test::random_floats(K, 3);
  for (CpuPath path : supported_cpu_paths()) {
    std::vector<float> y(N);
    matmul_fp8_on_path(path, x.data(), K, w.q.data(), w.scale.data(), w.br, w.bc, y.data(), N, 1, N,
                       K, nullptr);
    EXPECT_FALSE(std::isnan(y[0])) << cpu_path_name(path);
    EXPECT_TRUE(std::isnan(y[1])) << cpu_path_name(path);
    EXPECT_TRUE(std::isnan(y[2])) << cpu_path_name(path);
  }
}

TEST(MatmulFp8, RejectsBlockWidthNotMultipleOf16) {
  const Fp8Weight w = make_weight(2, 24, 128, 24, 1, false);
  std::vector<float> x(24, 1.0f), y(2);
  EXPECT_THROW(matmul_fp8_on_path(CpuPath::kScalar, x.data(), 24, w.q.data(), w.scale.data(), 128,
                                  24, y.data(), 2, 1, 2, 24, nullptr),
               Error);
}

}  // namespace
}  // namespace qtk
