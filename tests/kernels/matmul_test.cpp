#include "kernels/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/ref/reference.h"
#include "tests/kernels/test_util.h"

namespace qtk {
namespace {

struct Weights {
  DType type;
  std::vector<uint16_t> half;
  std::vector<float> full;
  const void* data() const {
    return type == DType::F32 ? static_cast<const void*>(full.data()) : half.data();
  }
};

Weights make_weights(DType t, int64_t N, int64_t K, uint32_t seed) {
  Weights w{t, {}, {}};
  auto v = test::random_floats(N * K, seed, 0.05f);
  if (t == DType::F32) {
    w.full = v;
  } else {
    w.half.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      w.half[i] = t == DType::BF16 ? test::float_to_bf16(v[i]) : test::float_to_f16(v[i]);
    }
  }
  return w;
}

std::string label(CpuPath p, DType t, int64_t M, int64_t N, int64_t K) {
  return std::string(cpu_path_name(p)) + " " + std::string(dtype_name(t)) +
         " M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K);
}

TEST(Matmul, MatchesReferenceOnAwkwardSizesEveryPathAndDtype) {
  ThreadPool pool(2);
  const int64_t sizes_mk[][2] = {{1, 1}, {3, 17}, {1, 63}, {5, 130}, {17, 64}, {4, 257}, {9, 1000}};
  const int64_t ns[] = {1, 3, 17, 63, 130};
  for (CpuPath path : supported_cpu_paths()) {
    for (DType t : {DType::BF16, DType::F16, DType::F32}) {
      for (auto& mk : sizes_mk) {
        for (int64_t N : ns) {
          const int64_t M = mk[0], K = mk[1];
          const int64_t ldx = K + 3, ldy = N + 5;  // strided rows
          auto x = test::random_floats(M * ldx, 11 + M * 7 + K);
          Weights w = make_weights(t, N, K, 5 + N + K);
          std::vector<float> y(M * ldy, -1.0f), y_ref(M * ldy, -1.0f);
          matmul_on_path(path, x.data(), ldx, w.data(), t, y.data(), ldy, M, N, K, &pool);
          ref::matmul_ref(x.data(), ldx, w.data(), t, y_ref.data(), ldy, M, N, K);
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t n = 0; n < N; ++n) {
              double abs_sum = 0.0;
              for (int64_t k = 0; k < K; ++k) {
                abs_sum += std::fabs(x[m * ldx + k] * ref::weight_value(w.data(), t, n * K + k));
              }
              // note: f32 summation bound (Higham): |error| <= gamma_K * sum|x*w|
              // with gamma_K ~ K * 2^-24; our chains are shorter (K/lanes + a
              // tree), so this bound is safe yet catches a dropped or doubled term.
              // amx (bf16): three part sums of K terms each (bf16x3 split),
              // doubled in case the tile hardware rounds less tightly.
              double terms = path == CpuPath::kAmx && t == DType::BF16 ? 6.0 * K : K;
              double tol = (terms + 2) * std::ldexp(1.0, -24) * abs_sum + 1e-30;
              ASSERT_NEAR(y[m * ldy + n], y_ref[m * ldy + n], tol)
                  << label(path, t, M, N, K) << " at " << m << "," << n;
            }
            // Padding between rows is untouched.
            for (int64_t n = N; n < ldy; ++n) ASSERT_EQ(y[m * ldy + n], -1.0f);
          }
        }
      }
    }
  }
}

// note: the core batch-invariance property: each row of an M-row call is
// bit-identical to that row computed alone, and to any thread count.
TEST(Matmul, RowsAreBitIdenticalWhateverMAndThreads) {
  ThreadPool pool2(2), pool3(3);
  const int64_t N = 131, K = 515;
  for (CpuPath path : supported_cpu_paths()) {
    for (DType t : {DType::BF16, DType::F16, DType::F32}) {
      Weights w = make_weights(t, N, K, 99);
      for (int64_t M : {1, 2, 3, 5, 8, 13, 33}) {
        auto x = test::random_floats(M * K, 1000 + M);
        std::vector<float> full(M * N), alone(N), threaded(M * N), threaded3(M * N);
        matmul_on_path(path, x.data(), K, w.data(), t, full.data(), N, M, N, K, nullptr);
        matmul_on_path(path, x.data(), K, w.data(), t, threaded.data(), N, M, N, K, &pool2);
        matmul_on_path(path, x.data(), K, w.data(), t, threaded3.data(), N, M, N, K, &pool3);
        EXPECT_TRUE(test::bit_equal(full.data(), threaded.data(), M * N))
            << label(path, t, M, N, K);
        EXPECT_TRUE(test::bit_equal(full.data(), threaded3.data(), M * N))
            << label(path, t, M, N, K);
        for (int64_t m = 0; m < M; ++m) {
          matmul_on_path(path, x.data() + m * K, K, w.data(), t, alone.data(), N, 1, N, K, &pool2);
          ASSERT_TRUE(test::bit_equal(full.data() + m * N, alone.data(), N))
              << label(path, t, M, N, K) << " row " << m;
        }
        // A sub-range of columns (a different tiling) gives the same bits.
        std::vector<float> part(M * 40);
        matmul_on_path(path, x.data(), K, w.data(), t, part.data(), 40, M, 40, K, nullptr);
        for (int64_t m = 0; m < M; ++m) {
          ASSERT_TRUE(test::bit_equal(full.data() + m * N, part.data() + m * 40, 40));
        }
      }
    }
  }
}

TEST(Matmul, RejectsUnsupportedWeightDtype) {
  std::vector<float> x(4), y(4);
  std::vector<int8_t> w(16);
  try {
    matmul(x.data(), 4, w.data(), DType::I8, y.data(), 4, 1, 4, 4, nullptr);
    FAIL() << "expected qtk::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("I8"), std::string::npos) << e.what();
  }
}

// Run by ctest with QTK_CPU_PATH set to each path name and to a bad value
// (tests/kernels/CMakeLists.txt); without the variable it checks the default.
TEST(CpuPathSelection, HonoursTheEnvironmentVariable) {
  const char* env = std::getenv("QTK_CPU_PATH");
  std::string want = env ? env : "";
  if (want.empty()) {
    EXPECT_EQ(active_cpu_path(), supported_cpu_paths().back());
    return;
  }
  for (CpuPath p : kAllCpuPaths) {
    if (want == cpu_path_name(p)) {
      if (cpu_path_supported(p)) {
        EXPECT_EQ(active_cpu_path(), p);
      } else {
        // One line naming the variable and what the CPU lacks.
        try {
          active_cpu_path();
          ADD_FAILURE() << "unsupported path must be refused";
        } catch (const Error& e) {
          std::string msg = e.what();
          EXPECT_NE(msg.find("QTK_CPU_PATH"), std::string::npos) << msg;
          EXPECT_NE(msg.find(cpu_path_missing(p)), std::string::npos) << msg;
          EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
          std::printf("QTK_CPU_PATH=%s refused: %s\n", want.c_str(), msg.c_str());
        }
      }
      return;
    }
  }
  try {
    active_cpu_path();
    FAIL() << "expected qtk::Error for QTK_CPU_PATH=" << want;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("QTK_CPU_PATH"), std::string::npos) << e.what();
  }
}

TEST(Matmul, ReportsSupportedPaths) {
  auto paths = supported_cpu_paths();
  ASSERT_FALSE(paths.empty());
  EXPECT_EQ(paths.front(), CpuPath::kScalar);
  // Printed so that CI logs show which paths this machine exercised.
  std::string names;
  for (CpuPath p : paths) names += std::string(cpu_path_name(p)) + " ";
  std::printf("supported CPU paths: %s(active: %s)\n", names.c_str(),
              std::string(cpu_path_name(active_cpu_path())).c_str());
}

}  // namespace
}  // namespace qtk

namespace qtk {
namespace {

TEST(Matmul, LongRowsWithManyRowTilesMatchRowsAlone) {
  // K large enough that a converted weight panel holds fewer than the usual
  // 96 columns, and several row tiles: each row must equal the row alone.
  ThreadPool pool2(2);
  const int64_t N = 100, K = 2900, M = 9;
  for (CpuPath path : supported_cpu_paths()) {
    Weights w = make_weights(DType::BF16, N, K, 7);
    auto x = test::random_floats(M * K, 8);
    std::vector<float> full(M * N), alone(N);
    matmul_on_path(path, x.data(), K, w.data(), DType::BF16, full.data(), N, M, N, K, &pool2);
    for (int64_t m = 0; m < M; ++m) {
      matmul_on_path(path, x.data() + m * K, K, w.data(), DType::BF16, alone.data(), N, 1, N, K,
                     nullptr);
      ASSERT_TRUE(test::bit_equal(full.data() + m * N, alone.data(), N))
          << label(path, DType::BF16, M, N, K) << " row " << m;
    }
  }
}

}  // namespace
}  // namespace qtk
