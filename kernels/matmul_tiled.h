// Matmul against a bf16 weight repacked into tile order (the avx512 path's
// decode fast path). The Hugging Face layout stays the format of record:
// matmul() in kernels/matmul.h reads it on every path; this is a separate
// entry point a model may use when tiled_matmul_usable() says so.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "kernels/cpu/matmul_tiled_paths.h"
#include "kernels/cpu_features.h"
#include "kernels/thread_pool.h"

namespace qtk {

// Tile order of a bf16 weight w [N, K] (HF layout, row n = output column n):
// tile t = rows 6t..6t+5 (the last tile zero-padded to 6 rows), stored as
// K/16 consecutive pieces, each [6 rows][16 elements]:
//   wt[t*6*K + (k/16)*96 + j*16 + k%16] = w[6t + j, k]
// note: why: the avx512 tile multiplies 6 weight rows at once; in HF layout
// those are 6 interleaved streams of 2 KiB (K = 1024), which neither the
// hardware prefetchers nor software prefetch keep fed (M = 1, one thread on
// Zen 4: 22.5 GB/s against 28 GB/s for a plain read); in tile order the
// whole matrix is read front to back as one stream (30.6 GB/s).
inline constexpr int64_t kTiledRows = 6;
inline constexpr int64_t kTiledPiece = 16;

inline int64_t tiled_tiles(int64_t N) { return (N + kTiledRows - 1) / kTiledRows; }

// Elements (uint16) of the tile-order copy of an [N, K] weight.
inline int64_t tiled_weight_elements(int64_t N, int64_t K) {
  return tiled_tiles(N) * kTiledRows * K;
}

// True when matmul_tiled may stand in for matmul on `path`: avx512, bf16
// weights, K a multiple of 16 (no masked tail; every real Qwen shape).
inline bool tiled_matmul_usable(CpuPath path, DType wtype, int64_t K) {
  return path == CpuPath::kAvx512 && wtype == DType::BF16 && K > 0 && K % kTiledPiece == 0;
}

// Repacks rows [row_begin, row_end) of w (bf16 [N, K]) into wt (tile order,
// tiled_weight_elements(N, K) elements); rows >= N of the last tile are
// written as zeros by the call that covers row N - 1. Row ranges must start
// on a tile (a multiple of 6) or at 0.
inline void tile_weight_bf16(const uint16_t* w, int64_t N, int64_t K, int64_t row_begin,
                             int64_t row_end, uint16_t* wt) {
  const int64_t pad_end = row_end >= N ? tiled_tiles(N) * kTiledRows : row_end;
  for (int64_t n = row_begin; n < pad_end; ++n) {
    const int64_t t = n / kTiledRows, j = n % kTiledRows;
    uint16_t* dst = wt + t * kTiledRows * K + j * kTiledPiece;
    if (n >= N) {
      for (int64_t k = 0; k < K; k += kTiledPiece) {
        std::memset(dst + (k / kTiledPiece) * kTiledRows * kTiledPiece, 0,
                    kTiledPiece * sizeof(uint16_t));
      }
      continue;
    }
    const uint16_t* src = w + n * K;
    for (int64_t k = 0; k < K; k += kTiledPiece) {
      std::memcpy(dst + (k / kTiledPiece) * kTiledRows * kTiledPiece, src + k,
                  kTiledPiece * sizeof(uint16_t));
    }
  }
}

// y[m, n] = sum_k x[m, k] * w[n, k] with w given in tile order; bit for bit
// what matmul() computes from the HF layout on the avx512 path (same
// per-element reduction order; kernels/cpu/matmul_avx512.cpp), for any M and
// any thread count. Requires tiled_matmul_usable(CpuPath::kAvx512, BF16, K)
// and an avx512-capable CPU (the caller checked the path).
//   x: f32 [M, K] row stride ldx; wt: bf16 tile order of [N, K]; y: f32 [M, N] row stride ldy
// note: threads take whole tiles (pieces of the pool's split over tiles), so
// they only split independent outputs.
inline void matmul_tiled(const float* x, int64_t ldx, const uint16_t* wt, float* y, int64_t ldy,
                         int64_t M, int64_t N, int64_t K, ThreadPool* pool) {
  if (M <= 0 || N <= 0) return;
  parallel_for(pool, tiled_tiles(N), [&](int64_t t0, int64_t t1) {
    cpu::matmul_tiled_cols_avx512(x, ldx, wt, y, ldy, M, N, K, t0, t1);
  });
}

// out[i, :] = row ids[i] of a tile-order bf16 [N, K] matrix, as f32 (the
// embedding lookup of a table tied to a tiled lm_head; exact like
// embedding_lookup).
inline void tiled_rows_to_f32(const uint16_t* wt, int64_t K, const int32_t* ids, int64_t n,
                              float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = ids[i];
    const uint16_t* src = wt + (r / kTiledRows) * kTiledRows * K + (r % kTiledRows) * kTiledPiece;
    float* dst = out + i * K;
    for (int64_t k = 0; k < K; k += kTiledPiece) {
      const uint16_t* piece = src + (k / kTiledPiece) * kTiledRows * kTiledPiece;
      for (int64_t e = 0; e < kTiledPiece; ++e) {
        const uint32_t bits = static_cast<uint32_t>(piece[e]) << 16;
        std::memcpy(dst + k + e, &bits, sizeof(float));
      }
    }
  }
}

}  // namespace qtk
