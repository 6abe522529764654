// cuBLASLt GEMM wrapper: against the float64 reference, and batch invariance:
// row r of an M-row product is bitwise equal to the 1-row product of row r.
#include <cstdio>
#include <initializer_list>

#include "kernels/cuda/gemm.h"
#include "tests/cuda/gpu_test_util.h"
#include "tests/cuda/reference.h"

namespace qtk::cuda::test {
namespace {

struct GemmCase {
  DType in, out;
};

// ms: the row counts checked; the largest must come last. The defaults
// reach into each of Gemm's M ranges (1..16, 17..64, 65..511, 512..2047,
// 2048..); the float64 reference is computed up to kRefMaxM rows (the host
// reference of more would take seconds per shape), bitwise invariance for
// every row.
constexpr int64_t kRefMaxM = 1024;
template <class In, class Out>
void check_gemm(Gemm& gemm, int64_t N, int64_t K, DType in, DType out,
                std::initializer_list<int64_t> ms = {1, 2, 3, 16, 17, 64, 130, 511, 512, 1024, 2048,
                                                     2500}) {
  const int64_t max_m = *(ms.end() - 1);
  const auto xf = random_floats(max_m * K, -1, 1, 51), wf = random_floats(N * K, -1, 1, 52);
  const auto xh = to_device_type<In>(xf), wh = to_device_type<In>(wf);
  DeviceBuffer<In> x(xh), w(wh);
  // The 1-row product of every row, one call each.
  DeviceBuffer<Out> single(max_m * N);
  for (int64_t r = 0; r < max_m; ++r)
    gemm.run(x.get() + r * K, K, w.get(), K, single.get() + r * N, N, 1, N, K, in, out, nullptr);
  const auto one = single.download();
  const Vec xd = to_double(xh), wd = to_double(wh);
  for (const int64_t M : ms) {
    DeviceBuffer<Out> y(M * N);
    gemm.run(x.get(), K, w.get(), K, y.get(), N, M, N, K, in, out, nullptr);
    const auto got = y.download();
    if (M <= kRefMaxM) {
      const Vec ref = matmul_ref(Vec(xd.begin(), xd.begin() + M * K), wd, M, N, K);
      // note: inputs are exact in the reference, products of bf16 are exact
      // in f32, so the error is f32 accumulation over K (plus the output's
      // rounding to bf16, relative 2^-9, when out is BF16).
      EXPECT_LT(rel_error(got, ref), out == DType::BF16 ? 1e-2 : 1e-5) << "M " << M;
    }
    EXPECT_TRUE(bitwise_equal(got.data(), one.data(), M * N))
        << "M " << M << ": rows differ from 1-row products ("
        << gemm.describe(N, K, K, K, N, in, out) << ")";
  }
  // Which algorithms served (the small- and large-M alternates, when verified).
  std::printf("[ gemm     ] N %lld K %lld %s -> %s: %s\n", static_cast<long long>(N),
              static_cast<long long>(K), std::string(dtype_name(in)).c_str(),
              std::string(dtype_name(out)).c_str(), gemm.describe(N, K, K, K, N, in, out).c_str());
}

TEST(Gemm, Bf16InF32OutMatchesReferenceAndIsBatchInvariant) {
  Gemm gemm;
  check_gemm<bf16, float>(gemm, 3072, 1024, DType::BF16, DType::F32);
  check_gemm<bf16, float>(gemm, 520, 136, DType::BF16, DType::F32);
}

// note: a vocabulary-wide product (Qwen3's lm_head: 151936 rows) gets no
// cuBLASLt algorithm on the H100 and runs as column blocks; at M <= 16 the
// own kernel may take it in one launch (gemm.cpp). Either way each row must
// be the 1-row product's bits.
TEST(Gemm, VocabularyWideProductIsBatchInvariant) {
  Gemm gemm;
  check_gemm<bf16, float>(gemm, 151936, 64, DType::BF16, DType::F32, {1, 2, 16, 17, 24});
}

TEST(Gemm, Bf16InBf16OutMatchesReferenceAndIsBatchInvariant) {
  Gemm gemm;
  check_gemm<bf16, bf16>(gemm, 1024, 3072, DType::BF16, DType::BF16);
}

TEST(Gemm, F32InF32OutMatchesReferenceAndIsBatchInvariant) {
  Gemm gemm;
  check_gemm<float, float>(gemm, 1000, 1024, DType::F32, DType::F32);
  check_gemm<float, float>(gemm, 64, 36, DType::F32, DType::F32);
}

TEST(Gemm, RejectsBadArguments) {
  Gemm gemm;
  DeviceBuffer<float> a(64);
  EXPECT_THROW(
      gemm.run(a.get(), 8, a.get(), 8, a.get(), 8, 1, 8, 8, DType::F32, DType::BF16, nullptr),
      std::exception);
  EXPECT_THROW(
      gemm.run(a.get() + 1, 8, a.get(), 8, a.get(), 8, 1, 8, 8, DType::F32, DType::F32, nullptr),
      std::exception);
  EXPECT_THROW(
      gemm.run(a.get(), 8, a.get(), 8, a.get(), 8, 1, 8, 8, DType::I32, DType::F32, nullptr),
      std::exception);
}

}  // namespace
}  // namespace qtk::cuda::test
