// AVX-512 matmul path (compiled with -mavx512f -mavx512bw -mavx512vl -mfma -mf16c).
// note: see matmul_paths.h for why nothing here may be shared with other files.
// note: GCC 12 warns about its own _mm512_undefined_* helpers (self-initialised
// on purpose) once they are inlined here; the warning is a known false positive.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/matmul_paths.h"
#include "kernels/cpu/matmul_tiled_paths.h"

namespace qtk::cpu {

namespace {

constexpr int kLanes = 16;
constexpr int kMaxRows = 4;  // rows of x per register tile
constexpr int kMaxCols = 6;  // weight rows (output columns) per register tile
// note: 4 x 6 = 24 accumulators + 6 converted weight vectors + 1 x vector fit
// in the 32 zmm registers; each weight vector is used 4 times per load and
// each x vector 6 times, which keeps prefill close to FMA-bound.
constexpr int64_t kColumnBlock = 96;
// note: a block of 96 bf16 weight rows of K = 1024 is 192 KiB: it stays in L2
// while every row tile of x streams past it, so W is read from memory once
// per call whatever M is (decode at M = 1..64 is bandwidth-bound on W).

template <int WT>
constexpr int64_t kWeightBytes = WT == kWeightF32 ? 4 : 2;

template <int WT>
inline __m512 load_w(const void* w, int64_t i) {
  if constexpr (WT == kWeightBf16) {
    __m256i h =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(w) + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else if constexpr (WT == kWeightF16) {
    __m256i h =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(w) + i));
    return _mm512_cvtph_ps(h);
  } else {
    return _mm512_loadu_ps(static_cast<const float*>(w) + i);
  }
}

template <int WT>
inline __m512 load_w_masked(const void* w, int64_t i, __mmask16 mask) {
  if constexpr (WT == kWeightBf16) {
    __m256i h = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(w) + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else if constexpr (WT == kWeightF16) {
    __m256i h = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(w) + i);
    return _mm512_cvtph_ps(h);
  } else {
    return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(w) + i);
  }
}

// Fixed reduction tree: halves, then quarters, then pairs.
inline float reduce16(__m512 v) {
  __m256 lo = _mm512_castps512_ps256(v);
  __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  __m256 s8 = _mm256_add_ps(lo, hi);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
  return _mm_cvtss_f32(s1);
}

template <int WT, int MR, int NR>
void tile(const float* x, int64_t ldx, const void* w, float* y, int64_t ldy, int64_t K, int64_t n) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  const int64_t w0 = n * K;
  // note: the tile's NR weight rows are NR short streams (K = 1024 in bf16
  // is 2 KiB, 32 cache lines), too short for the hardware prefetcher to ramp
  // up before each ends, so the next tile's rows (contiguous after these)
  // are prefetched into L2 while this one computes, spread evenly over the
  // k loop. Into L2, not L1: a tile of K = 3072 rows is 36 KiB, more than
  // L1 holds. Measured on Zen 4 (1 thread, CPU time, weights streamed from
  // DRAM; bench/kernels/RESULTS.md): M = 1 13-14 -> 17-18 GB/s (K = 1024
  // and 3072; membw 22 GB/s), M = 4 8 -> 16 GB/s, M = 32 +7-17 %. When the
  // next tile is already in L2 (later row tiles of a column block) the
  // prefetches cost a few issue slots. Prefetches change no arithmetic.
  const char* next = reinterpret_cast<const char*>(w) + (w0 + NR * K) * kWeightBytes<WT>;
  constexpr int64_t kNextBytesPerStep = NR * kLanes * kWeightBytes<WT>;
  int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes, next += kNextBytesPerStep) {
    for (int64_t b = 0; b < kNextBytesPerStep; b += 64) _mm_prefetch(next + b, _MM_HINT_T1);
    __m512 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = load_w<WT>(w, w0 + j * K + k);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      __m512 xv = _mm512_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (k < K) {
    // note: masked lanes load zeros and add +0 to their accumulators, the
    // same for every M, so the tail keeps the fixed per-element order.
    __mmask16 mask = static_cast<__mmask16>((1u << (K - k)) - 1u);
    __m512 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = load_w_masked<WT>(w, w0 + j * K + k, mask);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      __m512 xv = _mm512_maskz_loadu_ps(mask, x + i * ldx + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) y[i * ldy + n + j] = reduce16(acc[i][j]);
  }
}

using TileFn = void (*)(const float*, int64_t, const void*, float*, int64_t, int64_t, int64_t);

template <int WT, int MR>
constexpr TileFn tile_for_cols(int nr) {
  switch (nr) {
    case 1:
      return tile<WT, MR, 1>;
    case 2:
      return tile<WT, MR, 2>;
    case 3:
      return tile<WT, MR, 3>;
    case 4:
      return tile<WT, MR, 4>;
    case 5:
      return tile<WT, MR, 5>;
    default:
      return tile<WT, MR, 6>;
  }
}

template <int WT>
TileFn tile_for(int mr, int nr) {
  switch (mr) {
    case 1:
      return tile_for_cols<WT, 1>(nr);
    case 2:
      return tile_for_cols<WT, 2>(nr);
    case 3:
      return tile_for_cols<WT, 3>(nr);
    default:
      return tile_for_cols<WT, 4>(nr);
  }
}

template <int WT>
void cols(const float* x, int64_t ldx, const void* w, float* y, int64_t ldy, int64_t M, int64_t K,
          int64_t n_begin, int64_t n_end) {
  for (int64_t nb = n_begin; nb < n_end; nb += kColumnBlock) {
    int64_t ne = nb + kColumnBlock < n_end ? nb + kColumnBlock : n_end;
    for (int64_t m = 0; m < M; m += kMaxRows) {
      int mr = static_cast<int>(M - m < kMaxRows ? M - m : kMaxRows);
      const float* xm = x + m * ldx;
      float* ym = y + m * ldy;
      for (int64_t n = nb; n < ne; n += kMaxCols) {
        int nr = static_cast<int>(ne - n < kMaxCols ? ne - n : kMaxCols);
        tile_for<WT>(mr, nr)(xm, ldx, w, ym, ldy, K, n);
      }
    }
  }
}

// Tile-order weights (kernels/matmul_tiled.h): tile t holds rows 6t..6t+5,
// stored as K/16 pieces of [6 rows][16 elements], so the tile is one
// sequential 12 KiB (K = 1024) stream.
constexpr int kTiledRows = 6;
static_assert(kTiledRows == kMaxCols, "a weight tile is one register tile's columns");

// note: the arithmetic of every output is the HF-layout tile's above, for K
// a multiple of 16: lane l of one accumulator sums x[m,k]*w[n,k] for k = l,
// l+16, ... in increasing k with one FMA each, then reduce16. Only the
// address a weight vector is loaded from differs. At M = 1 no software
// prefetch: the stream is sequential, which the hardware prefetchers follow;
// measured on Zen 4 (1 thread, M = 1, K = 1024, 768 MiB on huge pages):
// 30.6 GB/s without, 21-25 GB/s with next-tile or 1-24 KiB-ahead
// prefetches, 22.5 GB/s for the HF-layout tile with its prefetch, 28.2 GB/s
// for a plain read.
template <int MR>
void tiled_tile(const float* x, int64_t ldx, const uint16_t* t, float* y, int64_t ldy, int64_t K,
                int ncols) {
  __m512 acc[MR][kTiledRows];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < kTiledRows; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  // note: the next tile (the following 6*K elements) is prefetched into L2
  // while this one computes, as in the HF tile, but only for MR > 1: at M = 1
  // the sequential stream is faster without it (30.6 against 21-25 GB/s
  // above); at M = 4..8 the tile is slower without it (2 threads, N 3072,
  // K 1024, 288 MiB of copies, GFLOP/s tiled / HF: M = 4 67 / 98, M = 8
  // 88 / 135, M = 32 139 / 174 without; with it 106-126 / 115-129,
  // 143-151 / 150-162, 155 / 153; a prefetch two tiles ahead is no better).
  const char* next = reinterpret_cast<const char*>(t + kTiledRows * K);
  constexpr int64_t kStepBytes = kTiledRows * kLanes * 2;
  for (int64_t k = 0; k < K; k += kLanes, t += kTiledRows * kLanes, next += kStepBytes) {
    if constexpr (MR > 1) {
      for (int64_t b = 0; b < kStepBytes; b += 64) _mm_prefetch(next + b, _MM_HINT_T1);
    }
    __m512 wv[kTiledRows];
#pragma GCC unroll 8
    for (int j = 0; j < kTiledRows; ++j) wv[j] = load_w<kWeightBf16>(t, j * kLanes);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      __m512 xv = _mm512_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 8
      for (int j = 0; j < kTiledRows; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    // note: bounded by the compile-time tile width with a run-time test, so
    // every accumulator index is a constant and the array can stay in
    // registers whatever ncols is.
#pragma GCC unroll 8
    for (int j = 0; j < kTiledRows; ++j) {
      if (j < ncols) y[i * ldy + j] = reduce16(acc[i][j]);
    }
  }
}

using TiledTileFn = void (*)(const float*, int64_t, const uint16_t*, float*, int64_t, int64_t, int);

TiledTileFn tiled_tile_for(int mr) {
  switch (mr) {
    case 1:
      return tiled_tile<1>;
    case 2:
      return tiled_tile<2>;
    case 3:
      return tiled_tile<3>;
    default:
      return tiled_tile<4>;
  }
}

// note: tiles per column block: 16 tiles = 96 columns, as kColumnBlock.
constexpr int64_t kTiledBlock = kColumnBlock / kTiledRows;

}  // namespace

void matmul_tiled_cols_avx512(const float* x, int64_t ldx, const uint16_t* wt, float* y,
                              int64_t ldy, int64_t M, int64_t N, int64_t K, int64_t t_begin,
                              int64_t t_end) {
  const int64_t tile_elems = kTiledRows * K;
  for (int64_t tb = t_begin; tb < t_end; tb += kTiledBlock) {
    const int64_t te = tb + kTiledBlock < t_end ? tb + kTiledBlock : t_end;
    for (int64_t m = 0; m < M; m += kMaxRows) {
      const int mr = static_cast<int>(M - m < kMaxRows ? M - m : kMaxRows);
      const TiledTileFn fn = tiled_tile_for(mr);
      for (int64_t t = tb; t < te; ++t) {
        const int64_t n = t * kTiledRows;
        const int ncols = static_cast<int>(N - n < kTiledRows ? N - n : kTiledRows);
        fn(x + m * ldx, ldx, wt + t * tile_elems, y + m * ldy + n, ldy, K, ncols);
      }
    }
  }
}

void matmul_cols_avx512(const float* x, int64_t ldx, const void* w, int wtype, float* y,
                        int64_t ldy, int64_t M, int64_t K, int64_t n_begin, int64_t n_end) {
  switch (wtype) {
    case kWeightBf16:
      cols<kWeightBf16>(x, ldx, w, y, ldy, M, K, n_begin, n_end);
      break;
    case kWeightF16:
      cols<kWeightF16>(x, ldx, w, y, ldy, M, K, n_begin, n_end);
      break;
    default:
      cols<kWeightF32>(x, ldx, w, y, ldy, M, K, n_begin, n_end);
      break;
  }
}

}  // namespace qtk::cpu
