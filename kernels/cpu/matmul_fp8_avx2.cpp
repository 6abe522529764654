// AVX2 + FMA FP8 matmul path (compiled with -mavx2 -mfma).
// note: see matmul_paths.h for why nothing here may be shared with other files.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/matmul_fp8_paths.h"

namespace qtk::cpu {

namespace {

constexpr int kLanes = 8;
constexpr int kMaxRows = 4;
constexpr int kMaxCols = 3;
constexpr int64_t kColumnBlock = 96;
// note: tiles, blocks, the k order, zero-filled tails and the lane tree are
// those of the f32-weight tile in matmul_avx2.cpp; only the weight load
// differs. The decode is the one matmul_fp8_avx512.cpp explains.

inline __m256 decode_raw(__m128i bytes8) {
  const __m256i v = _mm256_slli_epi32(_mm256_cvtepi8_epi32(bytes8), 20);
  return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0x87F00000u))));
}

template <bool kBig>
inline __m256 weight(__m128i bytes8, __m256 s) {
  const __m256 raw = decode_raw(bytes8);
  __m256 w;
  if constexpr (kBig) {
    w = _mm256_mul_ps(_mm256_mul_ps(raw, _mm256_set1_ps(0x1p120f)), s);
  } else {
    w = _mm256_mul_ps(raw, s);
  }
  const __m256i nan =
      _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(raw), _mm256_set1_epi32(0x7FFFFFFF)),
                         _mm256_set1_epi32(0x07F00000));
  return _mm256_blendv_ps(w, _mm256_set1_ps(__builtin_nanf("")), _mm256_castsi256_ps(nan));
}

inline __m256 load_x_partial(const float* x, int count) {
  alignas(32) float buf[kLanes] = {};
  for (int l = 0; l < count; ++l) buf[l] = x[l];
  return _mm256_load_ps(buf);
}

inline float reduce8(__m256 v) {
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
  return _mm_cvtss_f32(s1);
}

struct Args {
  const float* x;
  int64_t ldx;
  const uint8_t* wq;
  const float* scale;
  int64_t sld, br, bc;
  float* y;
  int64_t ldy, K;
};

template <bool kBig, int MR, int NR>
void tile(const Args& a, const float* x, float* y, int64_t n) {
  __m256 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  const int64_t K = a.K;
  const uint8_t* w0 = a.wq + n * K;
  const float* srow[NR];
#pragma GCC unroll 8
  for (int j = 0; j < NR; ++j) srow[j] = a.scale + ((n + j) / a.br) * a.sld;
  for (int64_t kb = 0; kb < K; kb += a.bc) {
    const float f = kBig ? 1.0f : 0x1p120f;
    __m256 s[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) s[j] = _mm256_set1_ps(srow[j][kb / a.bc] * f);
    const int64_t ke = kb + a.bc < K ? kb + a.bc : K;
    int64_t k = kb;
    for (; k + kLanes <= ke; k += kLanes) {
      __m256 wv[NR];
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j)
        wv[j] =
            weight<kBig>(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w0 + j * K + k)), s[j]);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        __m256 xv = _mm256_loadu_ps(x + i * a.ldx + k);
#pragma GCC unroll 8
        for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
      }
    }
    if (k < ke) {
      // note: zero-filled tail lanes (weight +0, x +0) add +0, as in the
      // f32 path.
      const int count = static_cast<int>(ke - k);
      alignas(32) int32_t lanes[kLanes] = {};
      for (int l = 0; l < count; ++l) lanes[l] = -1;
      const __m256 keep = _mm256_castsi256_ps(_mm256_load_si256(reinterpret_cast<__m256i*>(lanes)));
      __m256 wv[NR];
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) {
        alignas(16) uint8_t buf[16] = {};
        for (int l = 0; l < count; ++l) buf[l] = w0[j * K + k + l];
        wv[j] = _mm256_and_ps(
            keep, weight<kBig>(_mm_load_si128(reinterpret_cast<const __m128i*>(buf)), s[j]));
      }
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        __m256 xv = load_x_partial(x + i * a.ldx + k, count);
#pragma GCC unroll 8
        for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) y[i * a.ldy + n + j] = reduce8(acc[i][j]);
  }
}

using TileFn = void (*)(const Args&, const float*, float*, int64_t);

template <bool kBig, int MR>
TileFn tile_for_cols(int nr) {
  switch (nr) {
    case 1:
      return tile<kBig, MR, 1>;
    case 2:
      return tile<kBig, MR, 2>;
    default:
      return tile<kBig, MR, 3>;
  }
}

template <bool kBig>
TileFn tile_for(int mr, int nr) {
  switch (mr) {
    case 1:
      return tile_for_cols<kBig, 1>(nr);
    case 2:
      return tile_for_cols<kBig, 2>(nr);
    case 3:
      return tile_for_cols<kBig, 3>(nr);
    default:
      return tile_for_cols<kBig, 4>(nr);
  }
}

template <bool kBig>
void cols(const Args& a, int64_t M, int64_t n_begin, int64_t n_end) {
  for (int64_t nb = n_begin; nb < n_end; nb += kColumnBlock) {
    const int64_t ne = nb + kColumnBlock < n_end ? nb + kColumnBlock : n_end;
    for (int64_t m = 0; m < M; m += kMaxRows) {
      const int mr = static_cast<int>(M - m < kMaxRows ? M - m : kMaxRows);
      for (int64_t n = nb; n < ne; n += kMaxCols) {
        const int nr = static_cast<int>(ne - n < kMaxCols ? ne - n : kMaxCols);
        tile_for<kBig>(mr, nr)(a, a.x + m * a.ldx, a.y + m * a.ldy, n);
      }
    }
  }
}

}  // namespace

void matmul_fp8_cols_avx2(const float* x, int64_t ldx, const uint8_t* wq, const float* scale,
                          int64_t sld, int64_t br, int64_t bc, float* y, int64_t ldy, int64_t M,
                          int64_t K, int64_t n_begin, int64_t n_end, bool big_scales) {
  const Args a{x, ldx, wq, scale, sld, br, bc, y, ldy, K};
  if (big_scales) {
    cols<true>(a, M, n_begin, n_end);
  } else {
    cols<false>(a, M, n_begin, n_end);
  }
}

}  // namespace qtk::cpu
