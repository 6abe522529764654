// The AMX matmul path (bf16 weights on AMX tiles, bf16x3-split activations).
// note: tests that run the tile instructions skip, naming what the CPU lacks,
// on machines without AMX; the split, the packing and the tiling (through the
// scalar model of the tile instructions) run wherever AVX-512 does.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/matmul_paths.h"
#include "kernels/matmul.h"
#include "tests/kernels/test_util.h"

namespace qtk {
namespace {

#define QTK_REQUIRE_PATH(path)                                                          \
  if (!cpu_path_supported(path))                                                        \
  GTEST_SKIP() << "CPU path " << cpu_path_name(path) << " not run: this machine lacks " \
               << cpu_path_missing(path)

float bf16_value(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

std::vector<uint16_t> random_bf16(int64_t n, uint32_t seed, float scale = 0.05f) {
  auto v = test::random_floats(n, seed, scale);
  std::vector<uint16_t> h(n);
  for (int64_t i = 0; i < n; ++i) h[i] = test::float_to_bf16(v[i]);
  return h;
}

// Double-precision reference and the tolerance for one output.
// note: tolerance: each product part * w is exact, so the only error is the
// f32 accumulation of 3 K terms (three part sums, each a chain of K adds, then
// two adds): |error| <= (3K + 2) u sum|x w| with u = 2^-24 for round to
// nearest; doubled in case the hardware's internal accumulation rounds less
// tightly than the SDM pseudocode says. Small enough to catch a dropped,
// doubled or misplaced term (each is >= |x w| of one term, far above this for
// these random inputs).
void check_against_reference(const float* x, int64_t ldx, const uint16_t* w, const float* y,
                             int64_t ldy, int64_t M, int64_t N, int64_t K,
                             const std::string& what) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double sum = 0.0, abs_sum = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        double p = static_cast<double>(x[m * ldx + k]) * bf16_value(w[n * K + k]);
        sum += p;
        abs_sum += std::fabs(p);
      }
      double tol = 2.0 * (3.0 * K + 2.0) * std::ldexp(1.0, -24) * abs_sum + 1e-30;
      ASSERT_NEAR(y[m * ldy + n], sum, tol) << what << " at m=" << m << " n=" << n;
    }
  }
}

std::string dims(int64_t M, int64_t N, int64_t K) {
  return "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K);
}

// ---- split and packing (AVX-512) -------------------------------------------

TEST(AmxSplit, PartsAddUpExactlyToX) {
  QTK_REQUIRE_PATH(CpuPath::kAvx512);
  std::vector<float> xs = {0.0f,
                           -0.0f,
                           1.0f,
                           -1.0f,
                           FLT_MIN,
                           -FLT_MIN,
                           from_bits(0x3F808000u),  // bf16 tie, even below
                           from_bits(0x3F818000u),  // bf16 tie, odd below
                           from_bits(0x3F80FFFFu),
                           from_bits(0x3FFFFFFFu),
                           1.0f + std::ldexp(1.0f, -23),
                           FLT_MAX * 0.5f,
                           from_bits(0x7F7F7FFFu),  // rounds to the largest bf16
                           from_bits(0x7F7F8000u),  // would round to inf: truncated
                           FLT_MAX,
                           -FLT_MAX,
                           from_bits(0x00000001u),  // denormals
                           from_bits(0x00008001u),
                           from_bits(0x807FFFFFu)};
  auto r = test::random_floats(4000, 77);
  for (size_t i = 0; i < r.size(); ++i) {
    xs.push_back(std::ldexp(r[i], static_cast<int>(i % 200) - 100));
  }
  const int64_t n = static_cast<int64_t>(xs.size());
  std::vector<uint16_t> hi(n), mid(n), lo(n);
  cpu::amx_split_bf16x3(xs.data(), n, hi.data(), mid.data(), lo.data());
  const float kBf16Max = from_bits(0x7F7F0000u);
  for (int64_t i = 0; i < n; ++i) {
    const float x = xs[i];
    // Exact sum in double (each part has 8 significant bits).
    double sum = static_cast<double>(bf16_value(hi[i])) + bf16_value(mid[i]) + bf16_value(lo[i]);
    if (std::fabs(x) >= std::ldexp(1.0f, -110)) {
      ASSERT_EQ(sum, static_cast<double>(x)) << "x bits " << std::hex << bits_of(x);
    } else {
      // note: below 2^-110 the last bits of x lie under bf16's smallest step
      // (2^-133): the parts are x rounded to that step.
      ASSERT_LE(std::fabs(sum - x), std::ldexp(1.0, -134)) << "x bits " << std::hex << bits_of(x);
    }
    if (std::fabs(x) <= kBf16Max) {
      EXPECT_EQ(hi[i], test::float_to_bf16(x)) << "hi is x rounded to nearest even";
    } else {
      EXPECT_EQ(hi[i], bits_of(x) >> 16) << "beyond the bf16 range hi is x truncated";
    }
    EXPECT_EQ(mid[i], test::float_to_bf16(x - bf16_value(hi[i])));
  }
  // Non-finite: hi carries it, the other parts are zero.
  std::vector<float> bad = {std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), from_bits(0x7F800001u)};
  std::vector<uint16_t> bh(4), bm(4), bl(4);
  cpu::amx_split_bf16x3(bad.data(), 4, bh.data(), bm.data(), bl.data());
  EXPECT_EQ(bh[0], 0x7F80);
  EXPECT_EQ(bh[1], 0xFF80);
  for (int i = 2; i < 4; ++i) EXPECT_TRUE(std::isnan(bf16_value(bh[i]))) << i;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(bm[i], 0) << i;
    EXPECT_EQ(bl[i], 0) << i;
  }
}

// B tile of group g, k block b: 16 rows (k pairs) x 16 columns x 2 bf16;
// column j = part j % 3 of row 5g + j / 3; column 15, rows >= M, k >= K: 0.
TEST(AmxPack, MatchesTheDocumentedPairLayout) {
  QTK_REQUIRE_PATH(CpuPath::kAvx512);
  for (int64_t M : {1, 5, 7, 13}) {
    for (int64_t K : {1, 2, 17, 32, 45, 64}) {
      const int64_t ldx = K + 5;
      auto x = test::random_floats(M * ldx, 3 + M * K);
      const int64_t groups = cpu::amx_groups(M), blocks = (K + 31) / 32;
      ASSERT_EQ(cpu::amx_packed_u16(M, K), groups * blocks * 512);
      std::vector<uint16_t> packed(cpu::amx_packed_u16(M, K), 0xABCD);
      cpu::amx_pack_x(x.data(), ldx, M, K, packed.data(), 0, groups);
      for (int64_t g = 0; g < groups; ++g) {
        for (int64_t b = 0; b < blocks; ++b) {
          const uint16_t* tile = packed.data() + (g * blocks + b) * 512;
          for (int p = 0; p < 16; ++p) {
            for (int j = 0; j < 16; ++j) {
              for (int e = 0; e < 2; ++e) {
                const int64_t m = g * 5 + j / 3, k = b * 32 + 2 * p + e;
                uint16_t want = 0;
                if (j < 15 && m < M && k < K) {
                  uint16_t parts[3];
                  cpu::amx_split_bf16x3(&x[m * ldx + k], 1, &parts[0], &parts[1], &parts[2]);
                  want = parts[j % 3];
                }
                ASSERT_EQ(tile[p * 32 + 2 * j + e], want)
                    << dims(M, 0, K) << " g=" << g << " b=" << b << " p=" << p << " j=" << j;
              }
            }
          }
        }
      }
    }
  }
}

// ---- tiling, through the scalar model of the tile instructions -------------

void emulated_matmul(const float* x, int64_t ldx, const uint16_t* w, float* y, int64_t ldy,
                     int64_t M, int64_t N, int64_t K, int64_t piece) {
  std::vector<uint16_t> packed(cpu::amx_packed_u16(M, K));
  std::vector<uint16_t> scratch(cpu::amx_scratch_u16(K));
  cpu::amx_pack_x(x, ldx, M, K, packed.data(), 0, cpu::amx_groups(M));
  for (int64_t n0 = 0; n0 < N; n0 += piece) {
    int64_t n1 = n0 + piece < N ? n0 + piece : N;
    cpu::matmul_cols_amx_emulated(packed.data(), M, K, w, y, ldy, n0, n1, scratch.data());
  }
}

TEST(AmxEmulated, MatchesReferenceOnAwkwardSizes) {
  QTK_REQUIRE_PATH(CpuPath::kAvx512);
  for (int64_t M : {1, 4, 5, 6, 11, 37}) {
    for (int64_t N : {1, 15, 17, 40, 130}) {
      for (int64_t K : {1, 17, 31, 32, 33, 100}) {
        const int64_t ldx = K + 3, ldy = N + 2;
        auto x = test::random_floats(M * ldx, 5 + M + K);
        auto w = random_bf16(N * K, 9 + N + K);
        std::vector<float> y(M * ldy, -1.0f);
        // Pieces of 16 or 48 columns: thread ranges as matmul.cpp cuts them.
        emulated_matmul(x.data(), ldx, w.data(), y.data(), ldy, M, N, K, N > 40 ? 48 : 16);
        check_against_reference(x.data(), ldx, w.data(), y.data(), ldy, M, N, K,
                                "emulated " + dims(M, N, K));
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t n = N; n < ldy; ++n) ASSERT_EQ(y[m * ldy + n], -1.0f) << "padding";
        }
      }
    }
  }
}

// Long K: several chunks of groups (the packed activations exceed one chunk).
TEST(AmxEmulated, ManyChunksRowsMatchRowsAlone) {
  QTK_REQUIRE_PATH(CpuPath::kAvx512);
  const int64_t M = 120, N = 33, K = 3001;
  auto x = test::random_floats(M * K, 21);
  auto w = random_bf16(N * K, 22);
  std::vector<float> y(M * N), alone(N);
  emulated_matmul(x.data(), K, w.data(), y.data(), N, M, N, K, 32);
  check_against_reference(x.data(), K, w.data(), y.data(), N, M, N, K, "emulated chunks");
  for (int64_t m : {0, 7, 59, 119}) {
    emulated_matmul(x.data() + m * K, K, w.data(), alone.data(), N, 1, N, K, 32);
    ASSERT_TRUE(test::bit_equal(y.data() + m * N, alone.data(), N)) << "row " << m;
  }
}

// ---- the real tile instructions (AMX) ---------------------------------------

TEST(AmxMatmul, MatchesReferenceOnAwkwardSizes) {
  QTK_REQUIRE_PATH(CpuPath::kAmx);
  ThreadPool pool(2);
  for (int64_t M = 1; M <= 37; M += (M < 7 ? 1 : 5)) {
    for (int64_t N : {1, 15, 17, 40, 130}) {
      for (int64_t K : {1, 17, 31, 32, 33, 100, 515}) {
        const int64_t ldx = K + 3, ldy = N + 2;
        auto x = test::random_floats(M * ldx, 5 + M + K);
        auto w = random_bf16(N * K, 9 + N + K);
        std::vector<float> y(M * ldy, -1.0f);
        matmul_on_path(CpuPath::kAmx, x.data(), ldx, w.data(), DType::BF16, y.data(), ldy, M, N, K,
                       &pool);
        check_against_reference(x.data(), ldx, w.data(), y.data(), ldy, M, N, K,
                                "amx " + dims(M, N, K));
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t n = N; n < ldy; ++n) ASSERT_EQ(y[m * ldy + n], -1.0f) << "padding";
        }
      }
    }
  }
}

// note: the batch-invariance contract: each row of an M-row call equals that
// row computed alone, bit for bit, for every M and 1..4 threads, and a
// sub-range of columns (another tiling) gives the same bits.
TEST(AmxMatmul, RowsBitIdenticalWhateverMAndThreads) {
  QTK_REQUIRE_PATH(CpuPath::kAmx);
  ThreadPool pool2(2), pool3(3), pool4(4);
  ThreadPool* pools[] = {nullptr, &pool2, &pool3, &pool4};
  for (auto [N, K] : {std::pair<int64_t, int64_t>{131, 515}, {64, 1024}, {40, 20}}) {
    auto w = random_bf16(N * K, 99 + K);
    for (int64_t M = 1; M <= 64; ++M) {
      auto x = test::random_floats(M * K, 1000 + M);
      std::vector<float> first(M * N), other(M * N), alone(N);
      matmul_on_path(CpuPath::kAmx, x.data(), K, w.data(), DType::BF16, first.data(), N, M, N, K,
                     nullptr);
      for (ThreadPool* p : pools) {
        matmul_on_path(CpuPath::kAmx, x.data(), K, w.data(), DType::BF16, other.data(), N, M, N, K,
                       p);
        ASSERT_TRUE(test::bit_equal(first.data(), other.data(), M * N))
            << dims(M, N, K) << " threads " << pool_size(p);
      }
      for (int64_t m = 0; m < M; ++m) {
        matmul_on_path(CpuPath::kAmx, x.data() + m * K, K, w.data(), DType::BF16, alone.data(), N,
                       1, N, K, &pool2);
        ASSERT_TRUE(test::bit_equal(first.data() + m * N, alone.data(), N))
            << dims(M, N, K) << " row " << m;
      }
      const int64_t part = N > 20 ? 20 : N;
      std::vector<float> sub(M * part);
      matmul_on_path(CpuPath::kAmx, x.data(), K, w.data() + 3 * K, DType::BF16, sub.data(), part, M,
                     part, K, &pool3);
      for (int64_t m = 0; m < M && N > part + 3; ++m) {
        ASSERT_TRUE(test::bit_equal(first.data() + m * N + 3, sub.data() + m * part, part))
            << dims(M, N, K) << " columns 3.. row " << m;
      }
    }
  }
}

TEST(AmxMatmul, ManyChunksRowsMatchRowsAlone) {
  QTK_REQUIRE_PATH(CpuPath::kAmx);
  ThreadPool pool(2);
  const int64_t M = 300, N = 100, K = 3072;
  auto x = test::random_floats(M * K, 31);
  auto w = random_bf16(N * K, 32);
  std::vector<float> y(M * N), alone(N);
  matmul_on_path(CpuPath::kAmx, x.data(), K, w.data(), DType::BF16, y.data(), N, M, N, K, &pool);
  check_against_reference(x.data(), K, w.data(), y.data(), N, M, N, K, "amx chunks");
  for (int64_t m = 0; m < M; m += 13) {
    matmul_on_path(CpuPath::kAmx, x.data() + m * K, K, w.data(), DType::BF16, alone.data(), N, 1, N,
                   K, nullptr);
    ASSERT_TRUE(test::bit_equal(y.data() + m * N, alone.data(), N)) << "row " << m;
  }
}

// The weight prefetch modes (QTK_AMX_PREFETCH) change no result.
TEST(AmxMatmul, PrefetchModesGiveIdenticalBits) {
  QTK_REQUIRE_PATH(CpuPath::kAmx);
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 200, 1024}, {13, 97, 515}}) {
    auto x = test::random_floats(M * K, 61);
    auto w = random_bf16(N * K, 62);
    std::vector<uint16_t> packed(cpu::amx_packed_u16(M, K)), scratch(cpu::amx_scratch_u16(K));
    cpu::amx_pack_x(x.data(), K, M, K, packed.data(), 0, cpu::amx_groups(M));
    std::vector<float> first(M * N), other(M * N);
    cpu::matmul_cols_amx(packed.data(), M, K, w.data(), first.data(), N, 0, N, scratch.data(), 0);
    check_against_reference(x.data(), K, w.data(), first.data(), N, M, N, K, dims(M, N, K));
    for (int mode = 1; mode <= 4; ++mode) {
      cpu::matmul_cols_amx(packed.data(), M, K, w.data(), other.data(), N, 0, N, scratch.data(),
                           mode);
      EXPECT_TRUE(test::bit_equal(first.data(), other.data(), M * N))
          << dims(M, N, K) << " prefetch mode " << mode;
    }
  }
}

// Non-bf16 weights on the amx path are the avx512 code, bit for bit.
TEST(AmxMatmul, OtherWeightTypesUseTheAvx512Code) {
  QTK_REQUIRE_PATH(CpuPath::kAmx);
  const int64_t M = 7, N = 37, K = 100;
  auto x = test::random_floats(M * K, 41);
  auto wf = test::random_floats(N * K, 42, 0.05f);
  std::vector<float> a(M * N), b(M * N);
  matmul_on_path(CpuPath::kAmx, x.data(), K, wf.data(), DType::F32, a.data(), N, M, N, K, nullptr);
  matmul_on_path(CpuPath::kAvx512, x.data(), K, wf.data(), DType::F32, b.data(), N, M, N, K,
                 nullptr);
  EXPECT_TRUE(test::bit_equal(a.data(), b.data(), M * N));
}

// Informational: whether the hardware's accumulation order is the SDM
// pseudocode's (the scalar model). Not required; printed for the record.
TEST(AmxMatmul, ReportsAgreementWithTheScalarModel) {
  QTK_REQUIRE_PATH(CpuPath::kAmx);
  const int64_t M = 37, N = 130, K = 515;
  auto x = test::random_floats(M * K, 51);
  auto w = random_bf16(N * K, 52);
  std::vector<float> hw(M * N), emu(M * N);
  matmul_on_path(CpuPath::kAmx, x.data(), K, w.data(), DType::BF16, hw.data(), N, M, N, K, nullptr);
  emulated_matmul(x.data(), K, w.data(), emu.data(), N, M, N, K, 48);
  int64_t differ = 0;
  for (int64_t i = 0; i < M * N; ++i) differ += bits_of(hw[i]) != bits_of(emu[i]);
  std::printf("amx hardware vs scalar model of TDPBF16PS: %lld of %lld outputs differ in bits\n",
              static_cast<long long>(differ), static_cast<long long>(M * N));
  check_against_reference(x.data(), K, w.data(), emu.data(), N, M, N, K, "emulated");
}

}  // namespace
}  // namespace qtk
