// cuBLASLt GEMM wrapper: against the float64 reference, and batch invariance:
// row r of an M-row product is bitwise equal to the 1-row product of row r;
// records of what tuning chose (the plan cache's content) reproduce its bits.
#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/tuning.h"
#include "kernels/cuda/compare.h"
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

// K slices (QTK_GEMM_SLICES=4): bf16 -> bf16 products with K >= 2048 are
// four slice chains added in order for every M (cuBLASLt's batched call and
// slice_sum above 16 rows, the own kernel's sliced form below where it is
// bit-equal); rows of every range equal to the 1-row products. N 2048
// makes M 2100 and 2500 run in two row blocks of the workspace; K 1024,
// N above 2048 and the f32 output are not sliced. (Row r's 1-row output
// sits at r * N: N a multiple of 8 keeps it 16-byte aligned.)
TEST(Gemm, KSlicesAreBatchInvariant) {
  Gemm gemm(0, kGemvSlices);
  EXPECT_EQ(gemm.slices_for(1024, 3072, DType::BF16, DType::BF16), kGemvSlices);
  EXPECT_EQ(gemm.slices_for(2048, 4096, DType::BF16, DType::BF16), kGemvSlices);
  EXPECT_EQ(gemm.slices_for(1024, 1024, DType::BF16, DType::BF16), 1);
  EXPECT_EQ(gemm.slices_for(5120, 2048, DType::BF16, DType::BF16), 1);
  EXPECT_EQ(gemm.slices_for(1024, 3072, DType::BF16, DType::F32), 1);
  check_gemm<bf16, bf16>(gemm, 1024, 3072, DType::BF16, DType::BF16);
  const std::string d = gemm.describe(1024, 3072, 3072, 3072, 1024, DType::BF16, DType::BF16);
  EXPECT_NE(d.find("K in 4 slices"), std::string::npos) << d;
  // The decode steps gain only if the own kernel gives the sliced plan's bits.
  EXPECT_NE(d.find("own kernel bit-equal"), std::string::npos) << d;
  check_gemm<bf16, bf16>(gemm, 1000, 2048, DType::BF16, DType::BF16, {1, 2, 16, 17, 64, 130, 600});
  check_gemm<bf16, bf16>(gemm, 2048, 2048, DType::BF16, DType::BF16, {1, 16, 17, 2100, 2500});
  check_gemm<bf16, bf16>(gemm, 520, 1024, DType::BF16, DType::BF16, {1, 16, 17, 130});
  EXPECT_THROW(Gemm(0, 3), std::exception);
}

TEST(Gemm, F32InF32OutMatchesReferenceAndIsBatchInvariant) {
  Gemm gemm;
  check_gemm<float, float>(gemm, 1000, 1024, DType::F32, DType::F32);
  check_gemm<float, float>(gemm, 64, 36, DType::F32, DType::F32);
}

// The tuning that outlives a process (Gemm::records / preload, the plan
// cache's content): each M range is tuned the first time a call needs it;
// a second Gemm given the first one's records tunes nothing and gives the
// same bits in every range; records whose plan algorithm is not the one
// this Gemm picks are not used (and the bits are still the same).
template <class In, class Out>
void check_records(DType in, DType out) {
  const int64_t N = 1024, K = 3072;
  const std::vector<int64_t> ms = {1, 5, 16, 17, 64, 65, 200, 512, 600};  // 4 ranges
  const int64_t max_m = 600;
  const auto xh = to_device_type<In>(random_floats(max_m * K, -1, 1, 61));
  const auto wh = to_device_type<In>(random_floats(N * K, -1, 1, 62));
  DeviceBuffer<In> x(xh), w(wh);
  auto products = [&](Gemm& g) {
    std::vector<std::vector<Out>> ys;
    for (const int64_t m : ms) {
      DeviceBuffer<Out> y(m * N);
      g.run(x.get(), K, w.get(), K, y.get(), N, m, N, K, in, out, nullptr);
      ys.push_back(y.download());
    }
    return ys;
  };
  const std::string what =
      fmt::format("{} -> {}", std::string(dtype_name(in)), std::string(dtype_name(out)));
  Gemm tuned;
  const auto want = products(tuned);
  EXPECT_EQ(tuned.stats().ranges_tuned, 4) << what << ": one tuning per range used";
  EXPECT_EQ(tuned.stats().ranges_cached, 0) << what;
  const std::vector<GemmPlanRecord> recs = tuned.records();
  ASSERT_EQ(recs.size(), 1u) << what;
  ASSERT_EQ(recs[0].ranges.size(), 4u) << what;

  Gemm cached;
  cached.preload(recs);
  const auto got = products(cached);
  for (size_t i = 0; i < ms.size(); ++i)
    EXPECT_TRUE(bitwise_equal(got[i].data(), want[i].data(), got[i].size()))
        << what << ": M " << ms[i] << " differs with preloaded records ("
        << cached.describe(N, K, K, K, N, in, out) << ")";
  EXPECT_EQ(cached.stats().ranges_tuned, 0) << what;
  EXPECT_EQ(cached.stats().ranges_cached, 4) << what;
  EXPECT_EQ(cached.stats().records_stale, 0) << what;
  const auto again = cached.records();
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].algo, recs[0].algo);
  ASSERT_EQ(again[0].ranges.size(), recs[0].ranges.size());
  for (size_t i = 0; i < recs[0].ranges.size(); ++i) {
    EXPECT_EQ(again[0].ranges[i].use, recs[0].ranges[i].use) << i;
    EXPECT_EQ(again[0].ranges[i].algo, recs[0].ranges[i].algo) << i;
    EXPECT_EQ(again[0].ranges[i].own_equal, recs[0].ranges[i].own_equal) << i;
  }

  // A record with another plan algorithm: not used; tuned instead.
  auto stale = recs;
  stale[0].algo[7] ^= 1;
  Gemm retuned;
  retuned.preload(stale);
  const auto got2 = products(retuned);
  for (size_t i = 0; i < ms.size(); ++i)
    EXPECT_TRUE(bitwise_equal(got2[i].data(), want[i].data(), got2[i].size()))
        << what << ": M " << ms[i];
  EXPECT_EQ(retuned.stats().records_stale, 1) << what;
  EXPECT_EQ(retuned.stats().ranges_cached, 0) << what;
  EXPECT_EQ(retuned.stats().ranges_tuned, 4) << what;

  // tune_remaining decides the ranges no call reached yet (--tune-only).
  Gemm lazy;
  DeviceBuffer<Out> y(N);
  lazy.run(x.get(), K, w.get(), K, y.get(), N, 1, N, K, in, out, nullptr);
  EXPECT_EQ(lazy.stats().ranges_tuned, 1) << what;
  lazy.tune_remaining(nullptr);
  EXPECT_EQ(lazy.stats().ranges_tuned, 5) << what;
  ASSERT_EQ(lazy.records().size(), 1u);
  EXPECT_EQ(lazy.records()[0].ranges.size(), 5u) << what;
  std::printf("[ gemm     ] records %s: %s\n", what.c_str(),
              cached.describe(N, K, K, K, N, in, out).c_str());
}

TEST(Gemm, PreloadedRecordsGiveTheTunedBitsWithoutTuning) {
  check_records<bf16, bf16>(DType::BF16, DType::BF16);
  check_records<bf16, float>(DType::BF16, DType::F32);
  check_records<float, float>(DType::F32, DType::F32);
}

// The on-device comparison behind the verification (compare.h).
TEST(Gemm, CountDifferingWordsCountsOnlyTheRowsPrefix) {
  const int64_t rows = 37, pitch = 1030, cols = 1001;  // in 16-bit words
  std::vector<uint16_t> a(rows * pitch), b;
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint16_t>(i * 2654435761u >> 7);
  b = a;
  for (int64_t r = 0; r < rows; ++r) b[r * pitch + cols + r % (pitch - cols)] ^= 1;  // padding
  DeviceBuffer<uint16_t> da(a), db(b);
  DeviceBuffer<unsigned long long> count(1);
  auto differing = [&](int64_t n_rows) {
    QTK_CUDA_CHECK(cudaMemset(count.get(), 0, sizeof(unsigned long long)));
    count_differing_words(da.get(), db.get(), n_rows, cols * 2, pitch * 2, count.get(), nullptr);
    return count.download()[0];
  };
  EXPECT_EQ(differing(rows), 0u) << "differences past the row's columns do not count";
  b[5 * pitch + 3] ^= 0x8000;
  b[36 * pitch + cols - 1] ^= 1;
  b[36 * pitch] ^= 2;
  db.upload(b);
  EXPECT_EQ(differing(rows), 3u);
  EXPECT_EQ(differing(36), 1u) << "only the first n rows";
  EXPECT_EQ(differing(0), 0u);
}

// QTK_GEMM_FREE=1 (a measurement mode, not batch invariant): each call runs
// cuBLASLt's own pick for its M, split-K allowed; the products still match
// the float64 reference, including the chunked vocabulary-wide one.
TEST(Gemm, FreeModeMatchesReference) {
  const Tuning saved = tuning();
  Tuning t = saved;
  t.gemm_free = true;
  set_tuning(t);
  {
    Gemm gemm;
    ASSERT_TRUE(gemm.free_mode());
    struct Shape {
      int64_t n, k;
    };
    for (const Shape sh : {Shape{1024, 3072}, Shape{151936, 64}, Shape{300, 200}}) {
      for (const int64_t M : {1, 7, 128, 300}) {
        if (sh.n > 16384 && M > 7) continue;  // (the host reference's time)
        const auto xh = to_device_type<bf16>(random_floats(M * sh.k, -1, 1, 61));
        const auto wh = to_device_type<bf16>(random_floats(sh.n * sh.k, -1, 1, 62));
        DeviceBuffer<bf16> x(xh), w(wh);
        DeviceBuffer<float> y(M * sh.n);
        gemm.run(x.get(), sh.k, w.get(), sh.k, y.get(), sh.n, M, sh.n, sh.k, DType::BF16,
                 DType::F32, nullptr);
        const Vec ref = matmul_ref(to_double(xh), to_double(wh), M, sh.n, sh.k);
        EXPECT_LT(rel_error(y.download(), ref), 1e-5)
            << "N " << sh.n << " K " << sh.k << " M " << M;
      }
    }
  }
  set_tuning(saved);
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
