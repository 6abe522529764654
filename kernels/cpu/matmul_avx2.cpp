// AVX2 + FMA matmul path (compiled with -mavx2 -mfma -mf16c).
// note: see matmul_paths.h for why nothing here may be shared with other files.
// note: GCC 12 warns about its own _mm512_undefined_* helpers (self-initialised
// on purpose) once they are inlined here; the warning is a known false positive.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/matmul_paths.h"

namespace qtk::cpu {

namespace {

constexpr int kLanes = 8;
constexpr int kMaxRows = 4;
constexpr int kMaxCols = 3;
// note: 4 x 3 = 12 accumulators + 3 weight vectors + 1 x vector = 16 ymm.
constexpr int64_t kColumnBlock = 96;

template <int WT>
inline __m256 load_w(const void* w, int64_t i) {
  if constexpr (WT == kWeightBf16) {
    __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else if constexpr (WT == kWeightF16) {
    __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i));
    return _mm256_cvtph_ps(h);
  } else {
    return _mm256_loadu_ps(static_cast<const float*>(w) + i);
  }
}

// Loads the last `count` (< 8) elements, zero-filled.
template <int WT>
inline __m256 load_w_partial(const void* w, int64_t i, int count) {
  if constexpr (WT == kWeightF32) {
    alignas(32) float buf[kLanes] = {};
    const float* src = static_cast<const float*>(w) + i;
    for (int l = 0; l < count; ++l) buf[l] = src[l];
    return _mm256_load_ps(buf);
  } else {
    alignas(16) uint16_t buf[kLanes] = {};
    const uint16_t* src = static_cast<const uint16_t*>(w) + i;
    for (int l = 0; l < count; ++l) buf[l] = src[l];
    return load_w<WT>(buf, 0);
  }
}

inline __m256 load_x_partial(const float* x, int count) {
  alignas(32) float buf[kLanes] = {};
  for (int l = 0; l < count; ++l) buf[l] = x[l];
  return _mm256_load_ps(buf);
}

// Fixed reduction tree: halves, then pairs (same shape as the scalar path).
inline float reduce8(__m256 v) {
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
  return _mm_cvtss_f32(s1);
}

template <int WT, int MR, int NR>
void tile(const float* x, int64_t ldx, const void* w, float* y, int64_t ldy, int64_t K, int64_t n) {
  __m256 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  const int64_t w0 = n * K;
  int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes) {
    __m256 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = load_w<WT>(w, w0 + j * K + k);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      __m256 xv = _mm256_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (k < K) {
    // note: zero-filled tail lanes add +0, identically for every M.
    int count = static_cast<int>(K - k);
    __m256 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = load_w_partial<WT>(w, w0 + j * K + k, count);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      __m256 xv = load_x_partial(x + i * ldx + k, count);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) y[i * ldy + n + j] = reduce8(acc[i][j]);
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
    default:
      return tile<WT, MR, 3>;
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

}  // namespace

void matmul_cols_avx2(const float* x, int64_t ldx, const void* w, int wtype, float* y, int64_t ldy,
                      int64_t M, int64_t K, int64_t n_begin, int64_t n_end) {
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
