// matmul_tiled (tile-order bf16 weights) against matmul on the avx512 path:
// the same bits for every output, any M, N, K (multiple of 16) and threads.
#include "kernels/matmul_tiled.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/embedding.h"
#include "kernels/matmul.h"

namespace qtk {
namespace {

uint32_t next(uint32_t& s) {
  s ^= s << 13;
  s ^= s >> 17;
  s ^= s << 5;
  return s;
}

std::vector<uint16_t> random_bf16(int64_t n, uint32_t seed) {
  std::vector<uint16_t> v(n);
  for (auto& e : v) {
    const uint32_t r = next(seed);
    // sign, exponent 2^-9..2^-3, 7 random mantissa bits (nonzero low bits so
    // that a changed summation order shows in the result)
    e = static_cast<uint16_t>(((r >> 31) << 15) | ((118u + (r >> 8) % 7) << 7) | (r & 0x7F));
  }
  return v;
}

std::vector<float> random_f32(int64_t n, uint32_t seed) {
  std::vector<float> v(n);
  for (auto& e : v) e = static_cast<float>(static_cast<int32_t>(next(seed))) * 4.6566e-10f;
  return v;
}

std::vector<uint16_t> tiled(const std::vector<uint16_t>& w, int64_t N, int64_t K) {
  std::vector<uint16_t> wt(tiled_weight_elements(N, K), 0xFFFF);
  // Two calls split at a tile boundary, as a model may do.
  const int64_t split = N > 12 ? 12 : 0;
  tile_weight_bf16(w.data(), N, K, 0, split, wt.data());
  tile_weight_bf16(w.data(), N, K, split, N, wt.data());
  return wt;
}

bool have_avx512() { return cpu_path_supported(CpuPath::kAvx512); }

TEST(TiledMatmul, LayoutIsTheDocumentedOne) {
  const int64_t N = 13, K = 48;
  const auto w = random_bf16(N * K, 7);
  const auto wt = tiled(w, N, K);
  ASSERT_EQ(static_cast<int64_t>(wt.size()), 3 * 6 * K);
  for (int64_t n = 0; n < 18; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      const uint16_t want = n < N ? w[n * K + k] : 0;
      EXPECT_EQ(wt[(n / 6) * 6 * K + (k / 16) * 96 + (n % 6) * 16 + k % 16], want)
          << "n=" << n << " k=" << k;
    }
  }
}

TEST(TiledMatmul, BitIdenticalToTheAvx512PathForAnyShapeAndThreads) {
  if (!have_avx512()) GTEST_SKIP() << "CPU lacks: " << cpu_path_missing(CpuPath::kAvx512);
  ThreadPool pool2(2), pool3(3);
  ThreadPool* pools[] = {nullptr, &pool2, &pool3};
  uint32_t seed = 11;
  for (int64_t K : {16, 64, 1024}) {
    for (int64_t N : {1, 5, 6, 7, 96, 101, 200}) {
      const auto w = random_bf16(N * K, seed++);
      const auto wt = tiled(w, N, K);
      for (int64_t M : {1, 2, 3, 4, 5, 9, 33}) {
        const int64_t ldx = K + 3, ldy = N + 2;
        const auto x = random_f32(M * ldx, seed++);
        std::vector<float> want(M * ldy, -7.0f);
        matmul_on_path(CpuPath::kAvx512, x.data(), ldx, w.data(), DType::BF16, want.data(), ldy, M,
                       N, K, nullptr);
        for (ThreadPool* pool : pools) {
          std::vector<float> got(M * ldy, -7.0f);
          matmul_tiled(x.data(), ldx, wt.data(), got.data(), ldy, M, N, K, pool);
          ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
              << "M=" << M << " N=" << N << " K=" << K << " threads=" << pool_size(pool);
        }
      }
    }
  }
}

TEST(TiledMatmul, RowsLookUpLikeTheEmbeddingTable) {
  const int64_t N = 20, K = 32;
  const auto w = random_bf16(N * K, 3);
  const auto wt = tiled(w, N, K);
  const int32_t ids[] = {0, 5, 6, 19, 7, 5};
  std::vector<float> want(6 * K), got(6 * K);
  embedding_lookup(w.data(), DType::BF16, K, ids, 6, want.data());
  tiled_rows_to_f32(wt.data(), K, ids, 6, got.data());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
}

TEST(TiledMatmul, UsableOnlyOnAvx512WithBf16AndWholePieces) {
  EXPECT_TRUE(tiled_matmul_usable(CpuPath::kAvx512, DType::BF16, 1024));
  EXPECT_FALSE(tiled_matmul_usable(CpuPath::kAvx512, DType::BF16, 1000));
  EXPECT_FALSE(tiled_matmul_usable(CpuPath::kAvx512, DType::F32, 1024));
  EXPECT_FALSE(tiled_matmul_usable(CpuPath::kAvx2, DType::BF16, 1024));
  EXPECT_FALSE(tiled_matmul_usable(CpuPath::kAmx, DType::BF16, 1024));
  EXPECT_FALSE(tiled_matmul_usable(CpuPath::kScalar, DType::BF16, 1024));
}

}  // namespace
}  // namespace qtk
